"""How the fabric check measures a pair of nodes, the same over either link (links.py) and either driver (the Ray
driver, driver.py; the head's own process, tcp.py): the sizes, the timeouts and the budget, each side's part of a
pair, and the figures both sides' results make.

A pair is rank 0 with one other rank: a small-message round trip (latency), then transfers each way growing from
64 KiB until one is long enough to be sure of (SIZES, SURE_S), the best of up to three at that size timed by the
receiver (a node's bandwidth is its slower direction). A node below the bar is measured again (measure_again). The
all-reduce's figures are a whole-group figure, which names no node.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .links import Link
from .verdict import below_bar, median

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
BUDGET = 50.0  # the whole check, inside the head's 60 s limit: pairs not reached by then fail as unmeasured


def error_text(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def transfer_error(e: BaseException, step: str, timeout: float) -> str:
    text = str(e).lower()
    if "timed out" in text or "timeout" in text:
        return f"{step} timed out after {timeout:g}s"
    return f"{step} failed ({error_text(e)})"


def timed_receive(link: Link) -> float:
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


def serve_transfers(link: Link) -> None:
    """The sending side of timed_receive."""
    while k := link.recv_small(TRANSFER_TIMEOUT):
        link.send_payload(SIZES[k - 1], TRANSFER_TIMEOUT)


def pair_side(link: Link, lead: bool) -> dict:
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
        return {"error": transfer_error(e, step, timeout)}


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
