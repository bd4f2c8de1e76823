"""The fabric check: before the head runs the command on a multi-node cluster, measure the network between the nodes
and read their GPUs' health, so that a bad node is named in one line before training instead of slowing every step
or hanging a collective hours in.

Two ways to run it, one verdict. Where the head has no GPU the backend is plain TCP whatever the workers have, and
the head measures from its own process against a probe server in every node's rlrig (fabric_tcp.py). Otherwise
lifecycle.run_head starts it as soon as its own Ray node is up, as `python -m rlrig.entrypoint.fabric --report PATH
--min-ratio R --nnodes N`: a Ray driver in the command's own environment, so it sees the cluster as the command would.
One probe actor per node (pinned to it, taking no CPU), started as its node joins, and once all N joined they form a
torch.distributed group where every node has a GPU (NCCL, training's own path), else they listen on plain TCP (the
path Gloo takes, measured without importing torch: fabric_links.py). Either way:
  1. pairwise, one pair at a time: each rank k > 0 with rank 0: a small-message round trip (latency), then transfers
     each way growing from 64 KiB until one is long enough to be sure of (SIZES, SURE_S), the best of up to three at
     that size timed by the receiver (a node's bandwidth is its slower direction);
  2. an all-reduce of ALLREDUCE_BYTES over every node, timed (over TCP: the ring all-reduce's transfers): a
     whole-group figure, which names no node, so it runs only once the pairs passed;
  3. NVML or amdsmi on each node (gpu_health.py, read before the check touches a GPU): uncorrected ECC errors,
     pending page retirements and a GPU mostly held by another process fail the node; clocks held down, memory
     partly held and a PCIe link below its maximum warn.
A node whose bandwidth is below min_ratio x the median, or whose transfer failed or timed out, fails the check.
Every pair has rank 0 at one end: a slow head slows all pairs alike and stands out from no median (the all-reduce
figure in the report shows it); with one worker there is no median to compare with, only failures count.
Exit: 0 passed (or nothing to check), 2 failed, anything else: the check itself broke (lifecycle says so).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta

from . import fabric_links, gpu_health
from .addresses import format_hostport
from .console import say
from .coordination import HOST_LABEL, RANK_LABEL, describe

REPORT_NAME = "fabric.json"  # in the head's temp dir
FAILED = 2
# each way, the transfer sizes tried in turn until one takes SURE_S: a fast link reaches the last (4 MiB, ~3 ms on
# 10 Gbit/s), a 20 Mbit/s one stops at 256 KiB (~0.1 s) instead of taking 1.7 s over 4 MiB for the same verdict
SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
PAIR_BYTES = SIZES[-1]
SURE_S = 0.05  # a transfer this long gives a rate the request's round trip and TCP's slow start hardly touch
PAIR_REPEATS = 3  # best of: one scheduling hiccup must not fail a good node; a slow link is slow every time
REPEAT_WITHIN = 0.5  # seconds: no repeat after a transfer this slow (the link's figure is clear; time is not free)
AGAIN = 2  # a node below the bar is measured this many more times before its figure stands
PINGS = 5
ALLREDUCE_BYTES = 2 << 20
ALLREDUCE_ITERS = 3
TRANSFER_TIMEOUT = 10.0  # each send or receive; a timeout fails the node (and bounds a dead link's cost)
WARMUP_TIMEOUT = 20.0  # the first operation of a pair or of the group: NCCL sets up its connections there
JOIN_TIMEOUT = 30.0  # actors started (GPU nodes' import torch) and the process group formed
BUDGET = 50.0  # the whole check, inside the head's 60 s limit: pairs not reached by then fail as unmeasured

# --- the verdict: pure, so that tests can feed it figures -----------------------------------------------------


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def name(node: dict) -> str:
    """`rank 2 (host, 10.0.0.3)`, as the rest of rlrig names nodes."""
    return describe(node["rank"], {node["rank"]: {"hostname": node.get("host", "")}}, node.get("ip", ""))


def judge(nodes: list[dict], min_ratio: float) -> dict:
    """The verdict on the per-node figures: {ok, median_mb_s, failed: [{rank, host, ip, reasons}], warnings, message}.

    A node's figures: rank, host, ip, mb_s (None for the head, which is every pair's other end), error (its pair or
    its probe failed), gpus (gpu_health readings)."""
    med, slow = measured_median(nodes), {n["rank"] for n in below_bar(nodes, min_ratio)}
    failed, warnings = [], []
    for n in sorted(nodes, key=lambda n: n["rank"]):
        reasons = []
        if n.get("error"):
            reasons.append(n["error"])
        elif n["rank"] in slow:
            reasons.append(f"{n['mb_s']:.1f} MB/s, below {min_ratio:g} x the median {med:.1f} MB/s")
        for gpu in n.get("gpus") or []:
            fails, warns = gpu_health.problems(gpu)
            reasons += fails
            warnings += [f"{name(n)}: {w}" for w in warns]
        if reasons:
            failed.append({"rank": n["rank"], "host": n.get("host", ""), "ip": n.get("ip", ""), "reasons": reasons})
    message = "; ".join(f"{name(f)}: {', '.join(f['reasons'])}" for f in failed)
    return {
        "ok": not failed,
        "median_mb_s": med,
        "min_ratio": min_ratio,
        "failed": failed,
        "warnings": warnings,
        "message": message,
    }


def node_line(n: dict) -> str:
    """One line per node: rank, host, IP, MB/s, ms (and its GPUs)."""
    if n.get("error"):
        net = f"FAILED: {n['error']}"
    elif n["rank"] == 0:
        net = "head (the other end of every pair)"
    elif n.get("mb_s") is None:
        net = "not measured (the check stopped at another node)"
    else:
        net = (
            f"{n['mb_s']:.1f} MB/s (from the head {n['to_mb_s']:.1f}, to it {n['from_mb_s']:.1f}), "
            f"round trip {n['rtt_ms']:.2f} ms"
        )
    gpus = n.get("gpus") or []
    return f"{name(n)}: {net}; GPUs: {len(gpus) if gpus else 'none'}"


def _read(report_path: str) -> dict:
    try:
        with open(report_path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}  # the check died before writing it: the caller says so


def failure_message(report_path: str, code: int) -> str:
    """The head's one-line error for a check that exited `code` (not 0), from the report when there is one."""
    report = _read(report_path)
    skip = "rerun with --no-fabric-check to skip it"
    if code == FAILED and report.get("message"):
        return f"fabric check failed: {report['message']}; report {report_path}; {skip}"
    return f"fabric check could not run (exit {code}); see its output above; {skip}"


def failed_ranks(report_path: str) -> list[int]:
    """The node ranks a failed check named (none where it could not run): each a failure of that node."""
    return [f["rank"] for f in _read(report_path).get("failed", [])]


# --- one probe per node ---------------------------------------------------------------------------------------


def error_text(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def _transfer_error(e: BaseException, step: str, timeout: float) -> str:
    text = str(e).lower()
    if "timed out" in text or "timeout" in text:
        return f"{step} timed out after {timeout:g}s"
    return f"{step} failed ({error_text(e)})"


def timed_receive(link) -> float:
    """Best MB/s of the transfers this side receives from the peer. The receiver asks for each one by its size's
    place in SIZES (small message: k for SIZES[k - 1], 0 done), so the clock starts before any byte left: nothing
    waits in socket buffers unmeasured. Sizes grow while a transfer is too short to be sure of (under SURE_S); at
    the size that is not (or the largest), the best of up to PAIR_REPEATS counts."""
    best, i, counted = 0.0, 0, 0
    while True:
        link.send_small(i + 1, TRANSFER_TIMEOUT)
        t0 = time.perf_counter()
        link.recv_payload(SIZES[i], TRANSFER_TIMEOUT)
        took = time.perf_counter() - t0
        if took < SURE_S and i < len(SIZES) - 1:
            i += 1
            continue
        best, counted = max(best, SIZES[i] / 1e6 / took), counted + 1
        if counted == PAIR_REPEATS or took > REPEAT_WITHIN:
            break
    link.send_small(0, TRANSFER_TIMEOUT)
    return best


def serve_transfers(link) -> None:
    """The sending side of timed_receive."""
    while k := link.recv_small(TRANSFER_TIMEOUT):
        link.send_payload(SIZES[k - 1], TRANSFER_TIMEOUT)


def pair_side(link, lead: bool) -> dict:
    """One side of a pair over a connected `link`; `lead` on rank 0, which sends first. Returns the MB/s this side
    received (and rtt_ms on rank 0), or the error, said from the other node's side: each pair is about it."""
    step, timeout = "the round trip with rank 0", WARMUP_TIMEOUT
    try:
        rtts = []
        for i in range(PINGS + 1):  # the first one warms up (NCCL connects a pair on its first transfer)
            t0 = time.perf_counter()
            if lead:
                link.send_small(1, timeout)
                link.recv_small(timeout)
            else:
                link.recv_small(timeout)
                link.send_small(1, timeout)
            if i:
                rtts.append(time.perf_counter() - t0)
            timeout = TRANSFER_TIMEOUT
        step = "the transfer from rank 0"
        if lead:
            serve_transfers(link)
            step = "the transfer to rank 0"
            return {"rtt_ms": median(rtts) * 1e3, "mb_s": timed_receive(link)}
        mb_s = timed_receive(link)
        step = "the transfer to rank 0"
        serve_transfers(link)
        return {"mb_s": mb_s}
    except Exception as e:  # a broken or slow link is what is measured here, not a bug
        return {"error": _transfer_error(e, step, timeout)}


def pair_figures(node: dict, head: dict | None, peer: dict | None, waited: float) -> None:
    """The pair's figures, or its error, into the node's dict, from both sides' results (None: no answer)."""
    errors = [r["error"] for r in (peer, head) if r and r.get("error")]
    if errors:  # the node's own side first: it says which direction broke
        node["error"] = errors[0]
    elif head is None or peer is None:
        node["error"] = f"no answer from its pair with rank 0 within {waited:.0f}s"
    else:
        node.update(
            rtt_ms=head["rtt_ms"],
            to_mb_s=peer["mb_s"],
            from_mb_s=head["mb_s"],
            mb_s=min(peer["mb_s"], head["mb_s"]),
        )


class Probe:
    """Runs as a Ray actor on one node: its end of every transfer, and its GPUs' health."""

    def __init__(self, torch_now: bool = True):
        # before this process touches a GPU: its own CUDA context is not memory another process holds
        self.gpus, self.gpu_probe = gpu_health.read_gpus()
        if torch_now:  # a GPU node, which measures over NCCL if every node has a GPU: seconds of CPU, begun at once
            import torch.distributed  # noqa: F401
        self.ready_at = time.time()
        self.server = None  # TCP: this probe's listener (fabric_links)

    def ready(self) -> float:
        """When this probe was ready to measure (wall clock): the report shows it against the cluster's forming."""
        return self.ready_at

    def address(self) -> tuple[str, int]:
        """Rank 0's under NCCL: where the group's TCP rendezvous listens (this node's IP and a port free here)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def listen(self) -> tuple[str, int]:
        """TCP: this probe's listener, where rank 0 takes each pair and every rank its ring neighbour."""
        import ray

        ip = ray.util.get_node_ip_address()
        self.server = fabric_links.listener(ip)
        return ip, self.server.getsockname()[1]

    def join(self, master, rank: int, world: int, backend: str, peers: list | None = None) -> bool:
        """Into the check: NCCL, a torch.distributed group with its rendezvous at `master`; TCP, the listeners of
        every rank (`peers`), connected to pair by pair."""
        self.rank, self.world, self.backend, self.peers = rank, world, backend, peers
        if backend == "tcp":
            return True
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        # NCCL on the GPU Ray shows the actor; Gloo on the CPU only where tests drive the torch path without a GPU
        self.device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{format_hostport(*master)}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=JOIN_TIMEOUT),
        )
        return True

    def _link(self, peer: int, nbytes: int, lead: bool, timeout: float):
        if self.backend != "tcp":
            return fabric_links.TorchLink(peer, nbytes, self.device)
        sock = fabric_links.accept(self.server, timeout) if lead else fabric_links.connect(self.peers[peer], timeout)
        return fabric_links.TcpLink(sock, nbytes)

    def pair(self, peer: int, nbytes: int, lead: bool) -> dict:
        """This node's side of a pair with `peer` (pair_side); `lead` on rank 0."""
        link = None
        try:
            link = self._link(peer, nbytes, lead, WARMUP_TIMEOUT)
            return pair_side(link, lead)
        except Exception as e:  # no link at all: as pair_side says a broken one
            return {"error": _transfer_error(e, "the round trip with rank 0", WARMUP_TIMEOUT)}
        finally:
            if link is not None:
                link.close()

    def allreduce(self, nbytes: int, iters: int) -> dict:
        try:
            if self.backend == "tcp":
                nxt = self.peers[(self.rank + 1) % self.world]
                args = (self.world, nbytes, iters, WARMUP_TIMEOUT, TRANSFER_TIMEOUT)
                seconds = fabric_links.ring_allreduce(
                    lambda t: fabric_links.accept(self.server, t), lambda t: fabric_links.connect(nxt, t), *args
                )
                return {"seconds": median(seconds)}
            import torch
            import torch.distributed as dist

            t = torch.ones(nbytes // 4, dtype=torch.float32, device=self.device)
            # warm-up: NCCL builds its rings here
            fabric_links.torch_wait(dist.all_reduce(t, async_op=True), self.device, WARMUP_TIMEOUT)
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fabric_links.torch_wait(dist.all_reduce(t, async_op=True), self.device, TRANSFER_TIMEOUT)
                times.append(time.perf_counter() - t0)
            return {"seconds": median(times)}
        except Exception as e:
            return {"error": error_text(e)}

    def health(self) -> dict:
        """This node's GPU readings, taken as this probe started."""
        return {"gpus": self.gpus, "gpu_probe": self.gpu_probe}


# --- the driver -----------------------------------------------------------------------------------------------


def cluster_nodes() -> list[dict]:
    """The alive rlrig nodes, by rank, with the Ray node each one is."""
    import ray

    out = []
    for n in ray.nodes():
        labels = n.get("Labels") or {}
        if n["Alive"] and RANK_LABEL in labels:
            out.append(
                {
                    "rank": int(labels[RANK_LABEL]),
                    "host": labels.get(HOST_LABEL, ""),
                    "ip": n["NodeManagerAddress"],
                    "node_id": n["NodeID"],
                    "gpu": n.get("Resources", {}).get("GPU", 0),
                }
            )
    return sorted(out, key=lambda n: n["rank"])


def _results(refs: list, timeout: float) -> list[dict | None]:
    """Each ref's value, an {"error"} for one that raised, None for one not done within `timeout`."""
    import ray

    ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout))
    out = []
    for ref in refs:
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            out.append(None)
            continue
        try:
            out.append(ray.get(ref))
        except Exception as e:  # the actor died or raised: that node's failure, named by the caller
            out.append({"error": error_text(getattr(e, "cause", None) or e)})
    return out


def new_probe(node: dict):
    """A probe pinned to `node`, holding one of its GPUs if it has any (NCCL, when every node has one)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return (
        ray.remote(Probe)
        .options(
            num_cpus=0,
            num_gpus=1 if node["gpu"] >= 1 else 0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["node_id"], soft=False),
        )
        .remote(node["gpu"] >= 1)
    )


def backend_of(nodes: list[dict]) -> str:
    """NCCL where every node has a GPU (the path training's collectives take), else plain TCP (Gloo's path)."""
    return "nccl" if all(n["gpu"] >= 1 for n in nodes) else "tcp"


def start_probes(nodes: list[dict], probes: list, backend: str) -> None:
    """All probes into the check (NCCL: one process group; TCP: every probe listening, each knowing the others'
    addresses); a node whose probe did not join gets its error."""
    deadline = time.monotonic() + JOIN_TIMEOUT
    firsts = [p.listen.remote() for p in probes] if backend == "tcp" else [probes[0].address.remote()]
    addresses = _results(firsts, JOIN_TIMEOUT)
    for n, a in zip(nodes, addresses):
        if not isinstance(a, (tuple, list)):
            n["error"] = "its probe did not start" + (f" ({a['error']})" if a else f" within {JOIN_TIMEOUT:g}s")
    if any(n.get("error") for n in nodes):
        return
    master, peers = tuple(addresses[0]), [tuple(a) for a in addresses] if backend == "tcp" else None
    # the group's own timeout is JOIN_TIMEOUT from the moment each rank calls in: a little more here to hear it say so
    joined = _results(
        [p.join.remote(master, i, len(nodes), backend, peers) for i, p in enumerate(probes)],
        deadline - time.monotonic() + TRANSFER_TIMEOUT,
    )
    for n, r in zip(nodes, joined):
        if r is not True:
            n["error"] = f"did not join the check's {backend} group" + (f" ({r['error']})" if r else "")


def measure_pairs(nodes: list[dict], probes: list, deadline: float, min_ratio: float) -> None:
    """Rank 0 with each other rank in turn; figures or an error into each node's dict."""
    pair_limit = WARMUP_TIMEOUT + 2 * TRANSFER_TIMEOUT  # its own timeouts end a pair sooner: this is for a hung probe

    def measure(n: dict) -> bool:
        """False when rank 0's probe is stuck in a transfer: no other pair can run."""
        limit = min(pair_limit, deadline - time.monotonic())
        k = n["rank"]
        head, peer = _results(
            [probes[0].pair.remote(k, PAIR_BYTES, True), probes[k].pair.remote(0, PAIR_BYTES, False)], limit
        )
        pair_figures(n, head, peer, limit)
        return head is not None

    for k in range(1, len(nodes)):
        if deadline - time.monotonic() <= 0:
            nodes[k]["error"] = f"not measured: the check's {BUDGET:g}s ran out on slower pairs before it"
        elif not measure(nodes[k]):
            for m in nodes[k + 1 :]:
                m["error"] = "not measured: the head's probe hung on an earlier pair"
            return
    measure_again(nodes, min_ratio, deadline, measure)


def measured_median(nodes: list[dict]) -> float | None:
    """The median bandwidth of the nodes measured without an error (None: none was)."""
    return median([n["mb_s"] for n in nodes if n.get("mb_s") is not None and not n.get("error")])


def below_bar(nodes: list[dict], min_ratio: float) -> list[dict]:
    """The nodes measured below min_ratio x the median: the ones judge fails on bandwidth."""
    med = measured_median(nodes)
    return [
        n for n in nodes if not n.get("error") and n.get("mb_s") is not None and med and n["mb_s"] < min_ratio * med
    ]


def measure_again(nodes: list[dict], min_ratio: float, deadline: float, measure: Callable[[dict], object]) -> None:
    """A node below the bar measured again, up to AGAIN times, each direction's best kept: a fast link moves its
    largest transfer in a millisecond or two, and one stall of a busy node (its Ray still starting on a shared CPU)
    can spoil every try of a pair; a slow link is slow every time. `measure(node)` measures one pair into `node`."""
    for _ in range(AGAIN):
        for n in below_bar(nodes, min_ratio):
            if time.monotonic() > deadline:
                return
            again = {k: n[k] for k in ("rank", "host", "ip", "probe") if k in n}
            measure(again)
            if again.get("error"):
                continue  # it had its figure; failing to measure it again says nothing faster
            to, back = max(n["to_mb_s"], again["to_mb_s"]), max(n["from_mb_s"], again["from_mb_s"])
            n.update(to_mb_s=to, from_mb_s=back, mb_s=min(to, back), rtt_ms=min(n["rtt_ms"], again["rtt_ms"]))
            n["measured"] = n.get("measured", 1) + 1


def measure_allreduce(probes: list, deadline: float) -> dict:
    out = {"bytes": ALLREDUCE_BYTES, "iterations": ALLREDUCE_ITERS}
    if deadline - time.monotonic() < TRANSFER_TIMEOUT / 2:  # it names no node: not worth failing on a spent budget
        return {**out, "skipped": f"the check's {BUDGET:g}s were spent"}
    results = _results(
        [p.allreduce.remote(ALLREDUCE_BYTES, ALLREDUCE_ITERS) for p in probes],
        min(WARMUP_TIMEOUT + TRANSFER_TIMEOUT, deadline - time.monotonic()),
    )
    return allreduce_figures(results)


def allreduce_figures(results: list[dict | None]) -> dict:
    """The all-reduce's entry in the report from every rank's result (None: no answer), by rank."""
    out = {"bytes": ALLREDUCE_BYTES, "iterations": ALLREDUCE_ITERS}
    errors = [f"rank {i}: {r['error'] if r else 'no answer'}" for i, r in enumerate(results) if not r or r.get("error")]
    if errors:
        return {**out, "error": "; ".join(errors)}
    seconds = max(r["seconds"] for r in results)  # the collective ends when its slowest rank does
    n = len(results)
    algbw = ALLREDUCE_BYTES / 1e6 / seconds
    # bus bandwidth as nccl-tests defines it: what each link carried, comparable across node counts
    return {**out, "seconds": seconds, "algbw_mb_s": algbw, "busbw_mb_s": algbw * 2 * (n - 1) / n}


def collect_ready(nodes: list[dict], probes: list, formed_at: float) -> None:
    """Each probe's readiness in seconds after the last node joined (negative: it was ready before)."""
    for n, r in zip(nodes, _results([p.ready.remote() for p in probes], TRANSFER_TIMEOUT)):
        if isinstance(r, float):
            n["probe_ready_s"] = round(r - formed_at, 2)


def collect_gpus(nodes: list[dict], probes: list) -> None:
    for n, r in zip(nodes, _results([p.health.remote() for p in probes], TRANSFER_TIMEOUT)):
        if r and "gpus" in r:
            n.update(gpus=r["gpus"], gpu_probe=r["gpu_probe"])
        else:
            n.update(gpus=[], gpu_probe=f"no answer ({r['error']})" if r else "no answer")


def release(probes: list, wait: float = 10.0) -> None:
    """End the probes now, and wait until Ray counts their GPUs free again: the command's first placement group
    must not queue behind a probe that is still going away."""
    import ray

    for p in probes:
        ray.kill(p, no_restart=True)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and ray.available_resources().get("GPU", 0) < ray.cluster_resources().get(
        "GPU", 0
    ):
        time.sleep(0.2)


def check(nodes: list[dict], probes: list, min_ratio: float, t0: float, formed_at: float) -> dict:
    """Join the probes (one per node, in `nodes`' order), measure, judge: the report (without its end: see run)."""
    backend = backend_of(nodes)
    phases = {}  # seconds each part took from t0 (the last node joined): where the check's time goes, in the report

    def lap(phase: str) -> None:
        phases[phase] = time.monotonic() - t0 - sum(phases.values())

    start_probes(nodes, probes, backend)
    lap("start")  # what is left of the probes' start (`import torch`) once the last node joined, and the group
    allreduce: dict = {"skipped": "the group did not form"}
    try:
        if not any(n.get("error") for n in nodes):
            collect_ready(nodes, probes, formed_at)
            collect_gpus(nodes, probes)
            lap("gpus")
            measure_pairs(nodes, probes, t0 + BUDGET, min_ratio)
            lap("pairs")
            allreduce = {"skipped": "a node failed the pairwise check"}
            if judge(nodes, min_ratio)["ok"]:
                allreduce = measure_allreduce(probes, t0 + BUDGET)
                lap("allreduce")
    finally:
        release(probes)
    return report_of(nodes, allreduce, backend, phases, min_ratio)


def report_of(nodes: list[dict], allreduce: dict, backend: str, phases: dict, min_ratio: float) -> dict:
    """The verdict on the measured nodes and the all-reduce, with everything measured: the report (less `seconds`)."""
    verdict = judge(nodes, min_ratio)
    if allreduce.get("error"):
        verdict.update(ok=False, message=f"the all-reduce over every node failed: {allreduce['error']}")
    return {
        **verdict,
        "verdict": "passed" if verdict["ok"] else "failed",
        "backend": backend,
        "pair_bytes": PAIR_BYTES,
        "allreduce": allreduce,
        "nodes": nodes,
        "phases_s": phases,
    }


def run(min_ratio: float, nnodes: int, wait: float) -> dict:
    """The whole check against the cluster in RAY_ADDRESS; returns the report. Started by the head as soon as its own
    Ray node is up: a probe starts on each node as it joins (each probe's `import torch` is seconds of CPU, on nodes
    that join at different times anyway), and the measuring starts when `nnodes` joined (or `wait` ran out: the
    head fails the job on its own then)."""
    import logging

    import ray

    ray.init(logging_level=logging.ERROR, log_to_driver=False)  # the probes' own output is noise here
    try:
        probes: dict[int, object] = {}
        deadline = time.monotonic() + wait
        while True:
            nodes = cluster_nodes()
            for n in nodes:
                if n["rank"] not in probes:
                    probes[n["rank"]] = new_probe(n)
            if len(nodes) >= nnodes or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        t0, formed_at = time.monotonic(), time.time()
        if len(nodes) < 2:
            return {"ok": True, "verdict": "skipped", "message": "one node: no fabric to check", "nodes": nodes}
        report = check(nodes, [probes[n["rank"]] for n in nodes], min_ratio, t0, formed_at)
    finally:
        ray.shutdown()
    for n in report["nodes"]:
        n.pop("node_id", None)
    # from the last node's joining to the verdict: what the check adds to the time before the command
    return {**report, "seconds": time.monotonic() - t0}


def summary(report: dict) -> str:
    ar = report.get("allreduce") or {}
    ar_text = (
        f"all-reduce {ar['bytes'] >> 20} MiB: {ar['seconds'] * 1e3:.1f} ms (bus {ar['busbw_mb_s']:.0f} MB/s)"
        if "seconds" in ar
        else f"all-reduce {ar.get('skipped') or ar.get('error') or 'not run'}"
    )
    med = report.get("median_mb_s")
    return (
        f"{report['verdict']} in {report['seconds']:.1f}s over {len(report['nodes'])} nodes ({report['backend']}): "
        f"median {med:.1f} MB/s, {ar_text}"
        if med is not None
        else f"{report['verdict']} in {report['seconds']:.1f}s over {len(report['nodes'])} nodes ({report['backend']})"
    )


def brief(report: dict) -> dict:
    """What `rlrig doctor` shows of a report: the verdict and where the check's seconds went."""
    return {k: report.get(k) for k in ("verdict", "seconds", "phases_s", "backend", "median_mb_s")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlrig.entrypoint.fabric", description=__doc__.splitlines()[0])
    p.add_argument("--report", required=True, help="where to write the JSON report")
    p.add_argument("--min-ratio", type=float, default=0.5, help="a node below this x the median bandwidth fails")
    p.add_argument("--nnodes", type=int, default=2, help="start measuring once this many rlrig nodes joined")
    p.add_argument("--wait", type=float, default=300.0, help="seconds to wait for them (then measure the ones there)")
    args = p.parse_args(argv)
    report = run(args.min_ratio, args.nnodes, args.wait)
    if report.get("verdict") == "skipped":
        say(f"fabric: {report['message']}")
        return 0
    return publish(report, args.report)


def publish(report: dict, path: str) -> int:
    """Say the report's lines, write it to `path`; the check's exit code (0 passed, FAILED)."""
    for n in report["nodes"]:
        say(f"fabric: {node_line(n)}")
    for w in report["warnings"]:
        say(f"fabric: warning: {w}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    say(f"fabric: {summary(report)}; report {path}")  # on failure the head says why, in one line
    return 0 if report["ok"] else FAILED


if __name__ == "__main__":
    sys.exit(main())
