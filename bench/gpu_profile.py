"""Where a phase's GPU time goes: each piece of the GPU's own work (kernels, memcpy, memset) in a phase's window,
counted once, summed into buckets by the CPU op that launched it, and the phase's GPU idle time (its wall time less
the summed work: one stream at world size 1). The device timeline's other events are not work: a record_function
range's annotation spans the kernels inside it, and a driver may place the host's waits there.

A kernel names the op that launched it by the op's correlation id, and shares its own correlation id with its
runtime launch event (cudaLaunchKernel); where the op is not recorded, the bucket comes from the op around that launch
event. The bucket comes from the op's name, its input shapes and its parents (a backward op's parent is its autograd
node; a custom autograd Function's forward is a range named after the Function):

    optimizer     anything under Optimizer.step
    memcpy        Memcpy/Memset, copies and casts (aten::copy_, aten::_to_copy)
    comms         NCCL kernels, c10d collectives
    logprob fwd   under the log-prob Function's forward (its class name holds "Logprob")
    logprob bwd   under its backward node
    head          a matrix product with the vocabulary as one of its dimensions
    body matmuls  the other matrix products (grouped ones, a mixture of experts', included)
    attention     scaled dot product / flash / flex attention
    elementwise   the rest (and a kernel whose launch the profile did not record)
"""

from __future__ import annotations

from dataclasses import dataclass

MATMUL_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::matmul",
    "aten::linear",
    "aten::baddbmm",
    "aten::_grouped_mm",
)
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
# Kineto's activity types of the GPU's own work (libkineto ActivityType, unchanged since torch 1.9): memcpy, memset,
# kernel. The device timeline also holds user annotations (each record_function range, the phase's own included,
# spanning the kernels inside it) and, on some drivers, the host's waits; counted, they would count time twice.
GPU_WORK = (3, 4, 5)
# torch 2.11's Kineto events carry no activity type (2.13's do): there, the device timeline's events that are not the
# GPU's work are told by what Kineto names them (libkineto's CUDA sync activities) besides the user annotations.
HOST_WAITS = ("Event Sync", "Stream Sync", "Context Sync", "Stream Wait Event", "Command Buffer Full")


@dataclass(frozen=True)
class Kernel:
    """One piece of the GPU's work: its name, its start (microseconds from the trace's start), its seconds, the
    correlation id of the op that launched it (0: none recorded) and its own, which its runtime launch event shares."""

    name: str
    start_us: float
    seconds: float
    op_id: int
    launch_id: int


def _op(ev):
    """The op a runtime event belongs to: its nearest parent that is not one."""
    while ev.cpu_parent is not None and ev.name.startswith(RUNTIME):
        ev = ev.cpu_parent
    return ev


def bucket_of(ev, kernel_name: str, vocab: int) -> str:
    """The bucket of a kernel launched under `ev` (None: no launch recorded; its own name decides)."""
    op = _op(ev) if ev is not None else None
    joined = " ".join(_lineage(op)).lower()
    if "optimizer." in joined:
        return "optimizer"
    name = op.name if op is not None else ""
    if kernel_name.startswith(("Memcpy", "Memset")) or name in ("aten::copy_", "aten::_to_copy"):
        return "memcpy"
    if "nccl" in kernel_name.lower() or "nccl" in joined or "c10d::" in joined:
        return "comms"
    if "logprob" in joined:
        return "logprob bwd" if "backward" in joined else "logprob fwd"
    if any(m in joined for m in ATTENTION_MARKS) or any(m in kernel_name.lower() for m in ("fmha", "flash")):
        return "attention"
    if name in MATMUL_OPS:
        dims = {d for shape in (op.input_shapes or []) for d in (shape or [])}
        return "head" if vocab in dims else "body matmuls"
    return "elementwise"


def buckets_of(kernels, cpu_events, window: tuple[float, float], vocab: int) -> dict[str, float]:
    """Seconds per bucket of the kernels that start within `window` (microseconds), each counted once under the op
    that launched it (else under the op around its launch event), and the window's time no kernel ran."""
    ops, launches = {}, {}  # an op's correlation id -> the op; a launch's (the kernel's own id) -> the launch
    for e in cpu_events:
        (launches if e.name.startswith(RUNTIME) else ops).setdefault(e.id, e)
    start, end = window
    out = dict.fromkeys(BUCKETS, 0.0)
    for k in kernels:
        if not start <= k.start_us <= end:
            continue
        owner = ops.get(k.op_id) if k.op_id else None
        owner = owner or launches.get(k.launch_id)
        out[bucket_of(owner, k.name, vocab)] += k.seconds
    out["GPU idle"] = max(0.0, (end - start) / 1e6 - sum(out.values()))
    return out


def gpu_work(results) -> list[Kernel]:
    """The GPU's own work in a profiler's Kineto results, whose events carry the launching op's correlation id in
    torch 2.11 too (its FunctionEvent gained linked_correlation_id only in 2.13); times in the FunctionEvents'
    microseconds from the trace's start."""
    from torch.autograd import DeviceType

    t0 = results.trace_start_ns()
    return [
        Kernel(
            k.name(), (k.start_ns() - t0) / 1000, k.duration_ns() / 1e9, k.linked_correlation_id(), k.correlation_id()
        )
        for k in results.events()
        if k.device_type() == DeviceType.CUDA and not k.is_user_annotation() and _is_work(k)
    ]


def _is_work(k) -> bool:
    if hasattr(k, "activity_type"):
        return k.activity_type() in GPU_WORK
    return k.name() not in HOST_WAITS


def phase_buckets(prof, phase: str, vocab: int) -> dict[str, float]:
    """Seconds of GPU time per bucket in the window of the range named `phase`, and its idle time."""
    from torch.autograd import DeviceType

    events = prof.events()
    # the range on the host and its annotation on the device, which ends when the last of its kernels does
    windows = [e.time_range for e in events if e.name == phase]
    if not windows:
        raise SystemExit(f"the profile has no range named {phase!r}")
    kernels = gpu_work(prof.profiler.kineto_results)
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    return buckets_of(kernels, cpu, (min(w.start for w in windows), max(w.end for w in windows)), vocab)


def table(buckets: dict[str, float]) -> str:
    total = sum(buckets.values())
    rows = [f"{'bucket':14} {'seconds':>8} {'share':>6}"]
    rows += [f"{k:14} {v:8.3f} {100 * v / total:5.1f}%" for k, v in buckets.items()]
    rows.append(f"{'total':14} {total:8.3f}")
    return "\n".join(rows)
