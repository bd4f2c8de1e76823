"""Where a phase's GPU time goes: each kernel the GPU ran in a phase's window, counted once, summed into buckets by the
CPU op that launched it, and the phase's GPU idle time (its wall time less the summed kernels: one stream at world
size 1).

A kernel names its launch by correlation id; the launching op is the CPU event of that id, or, where only the
launch's runtime event (cudaLaunchKernel, "Command Buffer Full") carries it, the op around that event. The bucket
comes from the op's name, its input shapes and its parents (a backward op's parent is its autograd node; a custom
autograd Function's forward is a range named after the Function):

    optimizer     anything under Optimizer.step
    memcpy        Memcpy/Memset, copies and casts (aten::copy_, aten::_to_copy)
    comms         NCCL kernels, c10d collectives
    logprob fwd   under the log-prob Function's forward (its class name holds "Logprob")
    logprob bwd   under its backward node
    head          a matrix product with the vocabulary as one of its dimensions
    body matmuls  the other matrix products
    attention     scaled dot product / flash / flex attention
    elementwise   the rest (and a kernel whose launch the profile did not record)
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


RUNTIME = ("cuda", "cu", "Command Buffer", "Lazy Function", "Memcpy", "Memset")


def _op(ev):
    """The op a runtime event belongs to: its nearest parent that is not one."""
    while ev.cpu_parent is not None and ev.name.startswith(RUNTIME):
        ev = ev.cpu_parent
    return ev


def bucket_of(ev, kernel_name: str, vocab: int) -> str:
    op = _op(ev)
    joined = " ".join(_lineage(op)).lower()
    if "optimizer." in joined:
        return "optimizer"
    if kernel_name.startswith(("Memcpy", "Memset")) or op.name in ("aten::copy_", "aten::_to_copy"):
        return "memcpy"
    if "nccl" in kernel_name.lower() or "nccl" in joined or "c10d::" in joined:
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
    """Seconds of GPU time per bucket in the window of the range named `phase`, and its idle time."""
    from torch.autograd import DeviceType

    events = prof.events()
    windows = [e.time_range for e in events if e.name == phase]
    if not windows:
        raise SystemExit(f"the profile has no range named {phase!r}")
    start, end = windows[0].start, windows[-1].end
    ops, launches = {}, {}  # correlation id -> the op, or the runtime event, of that id
    for e in events:
        if e.device_type == DeviceType.CPU:
            (launches if e.name.startswith(RUNTIME) else ops).setdefault(e.id, e)
    out = dict.fromkeys(BUCKETS, 0.0)
    # the kernels from the profiler's Kineto results, whose events carry the launch's correlation id in torch 2.11
    # too (its FunctionEvent gained linked_correlation_id only in 2.13); times in the FunctionEvents' microseconds
    results = prof.profiler.kineto_results
    t0 = results.trace_start_ns()
    for k in results.events():
        at = (k.start_ns() - t0) / 1000
        if k.device_type() != DeviceType.CUDA or not start <= at <= end:
            continue
        owner = ops.get(k.linked_correlation_id()) or launches.get(k.linked_correlation_id())
        bucket = bucket_of(owner, k.name(), vocab) if owner is not None else "elementwise"
        out[bucket] += k.duration_ns() / 1e9
    wall = (end - start) / 1e6
    out["GPU idle"] = max(0.0, wall - sum(out.values()))
    return out


def table(buckets: dict[str, float]) -> str:
    total = sum(buckets.values())
    rows = [f"{'bucket':14} {'seconds':>8} {'share':>6}"]
    rows += [f"{k:14} {v:8.3f} {100 * v / total:5.1f}%" for k, v in buckets.items()]
    rows.append(f"{'total':14} {total:8.3f}")
    return "\n".join(rows)
