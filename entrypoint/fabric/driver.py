"""The fabric check: before the head runs the command on a multi-node cluster, measure the network between the nodes
and read their GPUs' health, so that a bad node is named in one line before training instead of slowing every step
or hanging a collective hours in.

This module is its Ray driver. Where the head has no GPU the backend is plain TCP whatever the workers have, and the
head measures from its own process against a probe server in every node's rlrig instead (tcp.py). Otherwise the head
starts this driver as soon as its own Ray node is up, as `python -m rlrig.entrypoint.fabric.driver --report PATH
--min-ratio R --nnodes N`: a Ray driver in the command's own environment, so it sees the cluster as the command
would. One probe actor per node (probe.py: pinned to it, taking no CPU), started as its node joins, and once all N
joined they form a torch.distributed group where every node has a GPU (NCCL, training's own path), else they listen
on plain TCP (the path Gloo takes, measured without importing torch: links.py). Either way:
  1. pairwise, one pair at a time: each rank k > 0 with rank 0 (protocol.py: latency, then bandwidth each way);
  2. an all-reduce of ALLREDUCE_BYTES over every node, timed (over TCP: the ring all-reduce's transfers): a
     whole-group figure, which names no node, so it runs only once the pairs passed;
  3. NVML or amdsmi on each node (gpu_health.py, read before the check touches a GPU): uncorrected ECC errors,
     pending page retirements and a GPU mostly held by another process fail the node; clocks held down, memory
     partly held and a PCIe link below its maximum warn.
The verdict (verdict.py) fails a node whose bandwidth is below min_ratio x the median, or whose transfer failed or
timed out; the report (report.py) holds it with every figure.
Exit: 0 passed (or nothing to check), 2 failed, anything else: the check itself broke (the head says so).
"""

from __future__ import annotations

import argparse
import sys
import time

from ..cluster.coordination import HOST_LABEL, RANK_LABEL
from ..console import say
from .probe import JOIN_TIMEOUT, Probe
from .protocol import (
    ALLREDUCE_BYTES,
    ALLREDUCE_ITERS,
    BUDGET,
    PAIR_BYTES,
    TRANSFER_TIMEOUT,
    WARMUP_TIMEOUT,
    allreduce_figures,
    error_text,
    measure_again,
    pair_figures,
)
from .report import publish, report_of
from .verdict import judge


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


def measure_allreduce(probes: list, deadline: float) -> dict:
    out = {"bytes": ALLREDUCE_BYTES, "iterations": ALLREDUCE_ITERS}
    if deadline - time.monotonic() < TRANSFER_TIMEOUT / 2:  # it names no node: not worth failing on a spent budget
        return {**out, "skipped": f"the check's {BUDGET:g}s were spent"}
    results = _results(
        [p.allreduce.remote(ALLREDUCE_BYTES, ALLREDUCE_ITERS) for p in probes],
        min(WARMUP_TIMEOUT + TRANSFER_TIMEOUT, deadline - time.monotonic()),
    )
    return allreduce_figures(results)


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlrig.entrypoint.fabric.driver", description=__doc__.splitlines()[0])
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


if __name__ == "__main__":
    sys.exit(main())
