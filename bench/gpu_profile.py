"""Where a phase's GPU time goes: the kernels that a phase's CPU ops launched, summed into buckets, and the
phase's GPU idle time (its wall time less the summed kernels: one stream at world size 1).

A kernel belongs to the innermost CPU op that launched it (the profiler links them by correlation id); the
bucket is chosen from that op's name, its input shapes and its parents (a backward op's parent is its
autograd node, a custom autograd Function's forward is a range named after the Function):

    optimizer     anything under Optimizer.step
    memcpy        Memcpy/Memset, and casts/copies (aten::copy_, aten::_to_copy)
    comms         NCCL kernels
    logprob fwd   under the log-prob Function's forward (its class name holds "Logprob")
    logprob bwd   under its backward node
    head          a matrix product with the vocabulary as one of its dimensions
    body matmuls  the other matrix products
    attention     scaled dot product / flash / flex attention
    elementwise   the rest
"""

from __future__ import annotations

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")
ATTENTION_MARKS = ("scaled_dot_product", "flash", "attention", "fmha", "flex")
BUCKETS = (
    "body matmuls",
    "head",
    "logprob fwd",
    "logprob bwd",
    "attention",
    "elementwise",
    "memcpy",
    "comms",
    "optimizer",
    "GPU idle",
)


def _lineage(ev) -> list[str]:
    names = []
    while ev is not None:
        names.append(ev.name)
        ev = ev.cpu_parent
    return names


def bucket_of(op, kernel_name: str, vocab: int) -> str:
    names = _lineage(op)
    joined = " ".join(names).lower()
    if "optimizer." in joined:
        return "optimizer"
    if kernel_name.startswith(("Memcpy", "Memset")) or op.name in ("aten::copy_", "aten::_to_copy"):
        return "memcpy"
    if "nccl" in kernel_name.lower():
        return "comms"
    if "logprob" in joined:
        return "logprob bwd" if "backward" in joined else "logprob fwd"
    if any(m in joined for m in ATTENTION_MARKS) or any(m in kernel_name.lower() for m in ("fmha", "flash")):
        return "attention"
    if op.name in MATMUL_OPS:
        dims = {d for shape in (op.input_shapes or []) for d in (shape or [])}
        return "head" if vocab in dims else "body matmuls"
    return "elementwise"


def phase_buckets(prof, phase: str, vocab: int) -> dict[str, float]:
    """Seconds of GPU time per bucket in the (CPU-side) window of the range named `phase`, and its idle time."""
    events = prof.events()
    windows = [e.time_range for e in events if e.name == phase]
    if not windows:
        raise SystemExit(f"the profile has no range named {phase!r}")
    start, end = windows[0].start, windows[-1].end
    out = dict.fromkeys(BUCKETS, 0.0)
    for ev in events:
        if not ev.kernels or not (start <= ev.time_range.start <= end):
            continue
        for k in ev.kernels:
            out[bucket_of(ev, k.name, vocab)] += k.duration / 1e6
    wall = (end - start) / 1e6
    out["GPU idle"] = max(0.0, wall - sum(out.values()))
    return out


def table(buckets: dict[str, float]) -> str:
    total = sum(buckets.values())
    rows = [f"{'bucket':14} {'seconds':>8} {'share':>6}"]
    rows += [f"{k:14} {v:8.3f} {100 * v / total:5.1f}%" for k, v in buckets.items()]
    rows.append(f"{'total':14} {total:8.3f}")
    return "\n".join(rows)
