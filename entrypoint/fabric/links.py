"""The fabric check's two ways of moving bytes between two probes (probe.py, tcp.py), behind one small interface: a
small message (one number) and a payload, each sent or received within a timeout.

- TorchLink: torch.distributed point-to-point in the check's group: NCCL where every node has a GPU, so the check
  measures the path training's collectives take (NVLink, InfiniBand, RoCE).
- TcpLink: a plain TCP connection, where some node has no GPU: what Gloo would carry, measured without importing
  torch. That import is seconds of CPU per node, most of the check's cost on CPU nodes; its figures are the same
  links'.

And the ring all-reduce's transfers over TCP (ring_allreduce): 2 (n - 1) steps, each sending a chunk of n-th of the
payload to the next rank while receiving one from the previous, as Gloo's and NCCL's ring all-reduce move bytes.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol


class Link(Protocol):
    """One end of a connected pair, as protocol.pair_side drives it (TorchLink, TcpLink; a new transport is one more
    class with these methods). Each call returns within `timeout` seconds or raises, and a raise is what the check
    reports for that node (a message with "timed out" or "timeout" in it reads as a timeout)."""

    def send_small(self, value: int, timeout: float) -> None:
        """Send one small number (0 to 255) to the peer."""

    def recv_small(self, timeout: float) -> int:
        """The next small number the peer sent."""

    def send_payload(self, nbytes: int, timeout: float) -> None:
        """Send `nbytes` bytes (at most what the link was made for)."""

    def recv_payload(self, nbytes: int, timeout: float) -> None:
        """Receive `nbytes` bytes, all of them, before returning."""

    def close(self) -> None:
        """Release the connection (the pair is done, or broke)."""


def torch_wait(work, device, timeout: float) -> None:
    """A torch.distributed work item done within `timeout` (on CUDA, its kernels too)."""
    from datetime import timedelta

    work.wait(timedelta(seconds=timeout))
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize()


class TorchLink:
    """One peer in the probe's torch.distributed group: tensors on `device` (CUDA: synchronised after each wait).
    A payload of n bytes is the first n of a buffer of `nbytes` (a contiguous slice: no copy)."""

    def __init__(self, peer: int, nbytes: int, device):
        import torch

        self.peer, self.device = peer, device
        self.small = torch.zeros(1, device=device)
        self.payload = torch.ones(nbytes // 4, dtype=torch.float32, device=device)

    def wait(self, work, timeout: float) -> None:
        torch_wait(work, self.device, timeout)

    def send_small(self, value: int, timeout: float) -> None:
        import torch.distributed as dist

        self.small.fill_(value)
        self.wait(dist.isend(self.small, self.peer), timeout)

    def recv_small(self, timeout: float) -> int:
        import torch.distributed as dist

        self.wait(dist.irecv(self.small, self.peer), timeout)
        return int(self.small.item())

    def send_payload(self, nbytes: int, timeout: float) -> None:
        import torch.distributed as dist

        self.wait(dist.isend(self.payload[: nbytes // 4], self.peer), timeout)

    def recv_payload(self, nbytes: int, timeout: float) -> None:
        import torch.distributed as dist

        self.wait(dist.irecv(self.payload[: nbytes // 4], self.peer), timeout)

    def close(self) -> None:
        pass


def recv_exactly(sock: socket.socket, buf: memoryview, timeout: float) -> None:
    """Fill `buf` from `sock`; the timeout bounds the whole receipt, not each chunk (a trickling link times out too)."""
    deadline = time.monotonic() + timeout
    got = 0
    while got < len(buf):
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        n = sock.recv_into(buf[got:])
        if n == 0:
            raise ConnectionError("the peer closed the connection")
        got += n


def listener(ip: str, only_ip: bool = False) -> socket.socket:
    """A listening socket on every address of this node's family (`only_ip`: on `ip` alone), on a free port."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    return socket.create_server((ip if only_ip else "", 0), family=family, backlog=64)


def accept(server: socket.socket, timeout: float) -> socket.socket:
    server.settimeout(timeout)
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # the round trip is one byte each way
    return conn


def connect(address: tuple[str, int], timeout: float) -> socket.socket:
    conn = socket.create_connection(tuple(address), timeout=timeout)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


class TcpLink:
    """A connected TCP socket to one peer: small messages are one byte, a payload of n bytes the first n of a buffer
    of `nbytes`."""

    def __init__(self, sock: socket.socket, nbytes: int):
        self.sock, self.nbytes = sock, nbytes
        self.payload = memoryview(bytearray(nbytes))
        self.small = memoryview(bytearray(1))

    def send_small(self, value: int, timeout: float) -> None:
        self.sock.settimeout(timeout)
        self.sock.sendall(bytes([value]))

    def recv_small(self, timeout: float) -> int:
        recv_exactly(self.sock, self.small, timeout)
        return self.small[0]

    def send_payload(self, nbytes: int, timeout: float) -> None:
        self.sock.settimeout(timeout)
        self.sock.sendall(self.payload[:nbytes])

    def recv_payload(self, nbytes: int, timeout: float) -> None:
        recv_exactly(self.sock, self.payload[:nbytes], timeout)

    def close(self) -> None:
        self.sock.close()


def ring_allreduce(
    accept_in: Callable[[float], socket.socket],
    connect_out: Callable[[float], socket.socket],
    n: int,
    nbytes: int,
    iters: int,
    warmup: float,
    timeout: float,
) -> list[float]:
    """The ring all-reduce's transfers among n ranks, each calling this with how it takes the previous rank's
    connection and how it opens its own to the next rank (each within a timeout): the seconds of each of `iters`
    after one warm-up (which connects the ring)."""
    with ThreadPoolExecutor(2) as pool:
        incoming = pool.submit(accept_in, warmup)
        out = connect_out(warmup)
        inc = incoming.result(warmup)
        try:
            chunk = memoryview(bytearray(max(1, nbytes // n)))
            got = memoryview(bytearray(len(chunk)))

            def once() -> float:
                t0 = time.perf_counter()
                for _ in range(2 * (n - 1)):
                    out.settimeout(timeout)
                    sending = pool.submit(out.sendall, chunk)
                    recv_exactly(inc, got, timeout)
                    sending.result(timeout)
                return time.perf_counter() - t0

            once()
            return [once() for _ in range(iters)]
        finally:
            out.close()
            inc.close()
