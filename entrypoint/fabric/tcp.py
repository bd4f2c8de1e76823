"""The fabric check over plain TCP inside rlrig's own processes: the path every check takes where the head has no GPU
(the backend is TCP then, whatever the workers have).

Every node's rlrig answers probes on a port of its own (ProbeServer, a thread started before its `ray start`, its
address in the facts it tells the head), so once the nodes formed the head measures at once: no Ray driver, no probe
actor per node, no `import ray` or worker process to wait for on a busy node. Each connection proves it holds the
cluster's token (an HMAC of a fresh challenge: a stranger cannot set a node sending), then asks for one thing:
  pair     the node's side of a pair with the head (protocol.pair_side), then its figures and GPU readings;
  ring     its leg of the ring all-reduce (links.ring_allreduce), its seconds back on the same connection;
  ring-in  the previous rank's ring connection, handed to that leg.
The pair protocol, the verdict, the report and its lines are the Ray path's (protocol.py, verdict.py, report.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import socket
import threading
import time

from ..console import say
from ..preflight import gpu_health
from . import links, protocol, verdict
from .report import publish, report_of

CHALLENGE = 32
MAX_MESSAGE = 1 << 20  # a request or an answer: one JSON message, GPU readings included


def key_of(token: str) -> bytes:
    """What both ends prove with: derived from the cluster token, never the token itself on the wire."""
    return hashlib.sha256(f"rlrig fabric check\n{token}".encode()).digest()


def send_message(sock: socket.socket, obj: dict, timeout: float) -> None:
    """One JSON message, its length first: the reader takes exactly its bytes, not the transfer's that follow."""
    data = json.dumps(obj).encode()
    sock.settimeout(timeout)
    sock.sendall(len(data).to_bytes(4, "big") + data)


def recv_message(sock: socket.socket, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    size = int.from_bytes(_recv_bytes(sock, 4, timeout), "big")
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes: not the fabric check's")
    return json.loads(_recv_bytes(sock, size, max(0.0, deadline - time.monotonic())))


def _recv_bytes(sock: socket.socket, n: int, timeout: float) -> bytes:
    buf = memoryview(bytearray(n))
    links.recv_exactly(sock, buf, timeout)
    return bytes(buf)


def dial(address, key: bytes, request: dict, timeout: float) -> socket.socket:
    """A connection to a node's ProbeServer that proved the token and asked for `request`."""
    sock = links.connect(tuple(address), timeout)
    try:
        nonce = _recv_bytes(sock, CHALLENGE, timeout)
        sock.settimeout(timeout)
        sock.sendall(hmac.new(key, nonce, hashlib.sha256).digest())
        send_message(sock, request, timeout)
        return sock
    except BaseException:
        sock.close()
        raise


class ProbeServer:
    """This node's end of the check: a daemon thread accepting the head's connections until close()."""

    def __init__(self, ip: str, token: str):
        self.key = key_of(token)
        # the node's own address only (Ray's raylet listens there too), not every interface the host has
        self.sock = links.listener(ip, only_ip=True)
        self.address = [ip, self.sock.getsockname()[1]]
        self.ring_in: queue.Queue[tuple[str, socket.socket]] = queue.Queue()  # (the ring's id, the connection)
        self._gpus: tuple[list[dict], str] | None = None
        self.thread = threading.Thread(target=self._accept, name="rlrig-fabric-probe", daemon=True)
        self.thread.start()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept: close() alone does not on Linux
        except OSError:
            pass
        self.sock.close()

    def health(self) -> dict:
        """The GPU readings, read once, when the head first asks (no CUDA context: NVML or amdsmi)."""
        if self._gpus is None:
            self._gpus = gpu_health.read_gpus()
        return {"gpus": self._gpus[0], "gpu_probe": self._gpus[1]}

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        kept = False
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.urandom(CHALLENGE)
            conn.settimeout(protocol.TRANSFER_TIMEOUT)
            conn.sendall(nonce)
            proof = _recv_bytes(conn, CHALLENGE, protocol.TRANSFER_TIMEOUT)
            if not hmac.compare_digest(proof, hmac.new(self.key, nonce, hashlib.sha256).digest()):
                return  # not the cluster's: said nothing, measured nothing
            request = recv_message(conn, protocol.TRANSFER_TIMEOUT)
            if request.get("op") == "pair":
                result = protocol.pair_side(links.TcpLink(conn, protocol.PAIR_BYTES), lead=False)
                send_message(conn, {**result, **self.health()}, protocol.TRANSFER_TIMEOUT)
            elif request.get("op") == "ring-in":
                self.ring_in.put((str(request.get("ring", "")), conn))
                kept = True
            elif request.get("op") == "ring":
                leg = self.ring(request["ring"], request["next"], request["n"])
                send_message(conn, leg, protocol.TRANSFER_TIMEOUT)
        except (OSError, ValueError, KeyError):
            pass  # the head's side of this connection fails too, and says which node and step
        finally:
            if not kept:
                conn.close()

    def ring(self, ring: str, nxt, n: int) -> dict:
        """This node's leg of the ring all-reduce `ring` (an id: a connection left from an earlier ring that broke
        is not this one's), `nxt` the next rank's ProbeServer."""

        def take(timeout: float) -> socket.socket:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    which, conn = self.ring_in.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise TimeoutError("timed out waiting for the previous rank's ring connection") from None
                if which == ring:
                    return conn
                conn.close()

        def give(timeout: float) -> socket.socket:
            return dial(nxt, self.key, {"op": "ring-in", "ring": ring}, timeout)

        try:
            args = (
                n,
                protocol.ALLREDUCE_BYTES,
                protocol.ALLREDUCE_ITERS,
                protocol.WARMUP_TIMEOUT,
                protocol.TRANSFER_TIMEOUT,
            )
            return {"seconds": verdict.median(links.ring_allreduce(take, give, *args))}
        except Exception as e:  # a broken link is what is measured here, not a bug
            return {"error": protocol.error_text(e)}


def _pair(node: dict, key: bytes) -> None:
    """The head's side of one pair, in this process; the figures (or the error) and the node's GPUs into `node`."""
    head, peer, sock = None, None, None
    try:
        sock = dial(node["probe"], key, {"op": "pair"}, protocol.WARMUP_TIMEOUT)
    except (OSError, ValueError) as e:
        where = f"{node['probe'][0]}:{node['probe'][1]}"
        node["error"] = f"its fabric probe at {where} did not answer ({protocol.error_text(e)})"
        return
    try:
        head = protocol.pair_side(links.TcpLink(sock, protocol.PAIR_BYTES), lead=True)
        # the node's own result (its side's error says which direction broke); soon, where this side already failed
        peer = recv_message(sock, 1.0 if head.get("error") else protocol.TRANSFER_TIMEOUT)
    except (OSError, ValueError):
        pass
    finally:
        sock.close()
    protocol.pair_figures(node, head, peer, protocol.TRANSFER_TIMEOUT)
    if peer and "gpus" in peer:
        node.update(gpus=peer["gpus"], gpu_probe=peer["gpu_probe"])
    else:
        node.update(gpus=[], gpu_probe="no answer")


def _allreduce(nodes: list[dict], own: ProbeServer, key: bytes) -> dict:
    """Every worker's leg asked for at once, then the head's own, in this thread; each leg's seconds or error."""
    n, asked, ring = len(nodes), {}, os.urandom(8).hex()
    try:
        for k in range(1, n):
            request = {"op": "ring", "ring": ring, "next": nodes[(k + 1) % n]["probe"], "n": n}
            try:
                asked[k] = dial(nodes[k]["probe"], key, request, protocol.WARMUP_TIMEOUT)
            except (OSError, ValueError) as e:
                why = f"rank {k}: its leg could not be asked for ({protocol.error_text(e)})"
                return {"bytes": protocol.ALLREDUCE_BYTES, "iterations": protocol.ALLREDUCE_ITERS, "error": why}
        results: list[dict | None] = [own.ring(ring, nodes[1]["probe"], n)]
        for k in range(1, n):
            try:
                results.append(recv_message(asked[k], protocol.WARMUP_TIMEOUT + protocol.TRANSFER_TIMEOUT))
            except (OSError, ValueError):
                results.append(None)
        return protocol.allreduce_figures(results)
    finally:
        for sock in asked.values():
            sock.close()


def check(nodes: list[dict], own: ProbeServer, token: str, min_ratio: float) -> dict:
    """The check on the formed cluster: `nodes` by rank, each {rank, host, ip, probe}; rank 0 is this node. Pairs
    one at a time (each has the head at one end: in parallel they would share its link and read low), then the
    all-reduce once they passed. The report, as driver.check's, with `seconds` from the call."""
    t0, phases, key = time.monotonic(), {}, key_of(token)

    def lap(phase: str) -> None:
        phases[phase] = time.monotonic() - t0 - sum(phases.values())

    nodes[0].update(own.health())
    lap("start")  # nothing left to start: every probe has listened since its node's rlrig began
    deadline = t0 + protocol.BUDGET
    for node in nodes[1:]:
        if time.monotonic() > deadline:
            node["error"] = f"not measured: the check's {protocol.BUDGET:g}s ran out on slower pairs before it"
            continue
        _pair(node, key)
    protocol.measure_again(nodes, min_ratio, deadline, lambda node: _pair(node, key))
    lap("pairs")
    allreduce: dict = {"skipped": "a node failed the pairwise check"}
    if verdict.judge(nodes, min_ratio)["ok"]:
        allreduce = _allreduce(nodes, own, key)
        lap("allreduce")
    report = report_of(nodes, allreduce, "tcp", phases, min_ratio)
    return {**report, "seconds": time.monotonic() - t0}


def run(nodes: list[dict], own: ProbeServer, token: str, min_ratio: float, path: str) -> int:
    """Check, say the lines, write the report to `path`: driver.main's exit code (0 passed, report.FAILED)."""
    say("checking the fabric between the nodes before the command (skip with --no-fabric-check)")
    return publish(check(nodes, own, token, min_ratio), path)
