"""Which GPUs other processes already compute on (NVML's process list), for `rlrig doctor`: a run beside another on
one machine should name its own GPUs (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES), and this says which are busy.

A warning, never a failure: a GPU may be shared on purpose (MPS, a small evaluation beside training).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from . import gpu_libraries
from .checks import PASS, WARN, Preflight

NAME = "gpus in use"
GIB = 1 << 30


def read() -> tuple[list[dict], str]:
    """[{"index", "uuid", "processes": [{"pid", "memory"}]}] per GPU NVML sees, and "NVML" or why there is no list.
    `memory` is None where the driver does not say (NVML's not-available value, which pynvml turns into None)."""
    with gpu_libraries.nvml() as (nv, why):
        if nv is None:
            return [], why
        gpus = []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = nv.nvmlDeviceGetUUID(handle)
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
                gpus.append(
                    {
                        "index": i,
                        "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                        "processes": [{"pid": p.pid, "memory": p.usedGpuMemory} for p in procs],
                    }
                )
        except nv.NVMLError as e:
            return gpus, f"NVML ({e})"
        return gpus, "NVML"


def process_name(pid: int) -> str:
    """The process's name, or "" where this host cannot see it (NVML names the host's pids, a container has its own)."""
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return ""


def visible(env: Mapping[str, str]) -> list[str] | None:
    """The GPUs this node's runs would use, as CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES name them (indices or
    UUIDs); None where neither narrows them."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if var in env:
            return [e.strip() for e in env[var].split(",") if e.strip()]
    return None


def _named(gpu: dict, entries: list[str] | None) -> bool:
    return entries is None or str(gpu["index"]) in entries or any(gpu["uuid"].startswith(e) for e in entries if e)


def findings(
    gpus: list[dict], entries: list[str] | None, own: set[int], name_of: Callable[[int], str] = process_name
) -> list[str]:
    """One line per GPU that a process other than `own` computes on: `GPU 1 (GPU-8c1e..., visible here): pid 4242
    (python, 3.1 GiB)`; a GPU this node's visible-devices variables leave out is said as such."""
    lines = []
    for g in gpus:
        procs = [p for p in g["processes"] if p["pid"] not in own]
        if not procs:
            continue
        users = []
        for p in procs:
            detail = ", ".join(
                x for x in (name_of(p["pid"]), f"{p['memory'] / GIB:.1f} GiB" if p["memory"] is not None else "") if x
            )
            users.append(f"pid {p['pid']}" + (f" ({detail})" if detail else ""))
        where = "visible here" if _named(g, entries) else "not visible here"
        lines.append(f"GPU {g['index']} ({g['uuid']}, {where}): {', '.join(users)}")
    return lines


def check(
    env: Mapping[str, str],
    pf: Preflight,
    reader: Callable[[], tuple[list[dict], str]] = read,
    name_of: Callable[[int], str] = process_name,
) -> None:
    """Add the `gpus in use` finding to `pf`: a warning naming each busy GPU and its processes; nothing where no GPU
    list can be read (a CPU node)."""
    gpus, source = reader()
    if not gpus:
        return
    lines = findings(gpus, visible(env), {os.getpid()}, name_of)
    if lines:
        pf.add(NAME, WARN, "other processes compute on GPUs here: " + "; ".join(lines))
    else:
        pf.add(NAME, PASS, f"no other process computes on this node's {len(gpus)} GPU(s) ({source})")
