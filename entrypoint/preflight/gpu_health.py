"""A node's GPU health for the fabric check: readings from NVML (NVIDIA) or amdsmi (AMD) in one vendor-neutral form,
and which of them fail the node or only warn.

A reading (one dict per GPU; None wherever this GPU or driver does not answer):
  index, name, vendor, error (the GPU is listed but cannot be read),
  ecc_uncorrected, retired_pages_pending, remap_pending, remap_failed, retire_failed,
  slowdowns (names of the clock limits active now), idle, clock_reasons (NVIDIA's raw bitmask, for the report),
  pcie_width, pcie_max_width, pcie_gen, pcie_max_gen,
  memory_total, memory_used (bytes, on the whole GPU; None on a MIG-partitioned one, whose other instances are
  other tenants' by design).
The fabric check reads them as its probe starts, before that probe touches a GPU, so its own CUDA context is not
counted as memory someone else holds.
"""

from __future__ import annotations

from . import gpu_libraries
from .inventory import _amd_model, _text

GIB = 1 << 30
# Less free than this share of a GPU fails its node: a leftover process holds what a 7B actor, its optimizer and the
# rollout engine's KV cache need, and the run would fail at its first allocation instead of here.
MEMORY_FAIL_FREE = 0.25
# Less free than this only warns: a driver keeps a little for itself, a reward server may share the GPU on purpose.
MEMORY_WARN_FREE = 0.90

# nvmlClocksEventReason* bits (nvml.h) that mean the GPU runs slower than asked for. Left out on purpose: idle,
# application clocks and the software power cap, which a healthy GPU shows in normal work.
NVML_SLOWDOWNS = {
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake slowdown",
}
NVML_IDLE = 0x1
# amdsmi_get_violation_status's active_* flags (MI300 and newer) with the same meaning; its package power (PPT) limit
# is the software power cap's counterpart and is left out for the same reason.
AMD_SLOWDOWNS = {
    "active_prochot_thrm": "hardware slowdown (PROCHOT)",
    "active_socket_thrm": "thermal slowdown",
    "active_hbm_thrm": "HBM thermal slowdown",
    "active_vr_thrm": "voltage regulator thermal slowdown",
}
# A PCIe generation from its transfer rate (GT/s)
PCIE_GENERATIONS = {2.5: 1, 5: 2, 8: 3, 16: 4, 32: 5, 64: 6}


def problems(gpu: dict) -> tuple[list[str], list[str]]:
    """(failures, warnings) for one GPU's readings."""
    what = f"GPU {gpu['index']}" + (f" ({gpu['name']})" if gpu.get("name") else "")
    if gpu.get("error"):  # e.g. fallen off the bus: the driver lists it but cannot read it
        api = {"nvidia": "NVML", "amd": "amdsmi"}.get(gpu.get("vendor"), "the driver")
        return [f"{what}: {api} cannot read it ({gpu['error']})"], []
    fails, warns = [], []
    if gpu.get("ecc_uncorrected"):
        fails.append(f"{what}: {gpu['ecc_uncorrected']} uncorrected ECC error(s) since the driver loaded")
    if gpu.get("retired_pages_pending"):
        fails.append(f"{what}: a page retirement is pending (it takes effect after a GPU reset)")
    if gpu.get("remap_pending"):
        fails.append(f"{what}: a row remapping is pending (it takes effect after a GPU reset)")
    if gpu.get("remap_failed"):
        fails.append(f"{what}: a row remapping failed (the GPU needs service)")
    if gpu.get("retire_failed"):
        fails.append(f"{what}: a bad memory page could not be retired (the GPU needs service)")
    total, used = gpu.get("memory_total"), gpu.get("memory_used")
    if total and used is not None:
        free = total - used
        held = f"{used / GIB:.1f} of {total / GIB:.1f} GiB held by other processes"
        if free < MEMORY_FAIL_FREE * total:
            fails.append(f"{what}: only {free / GIB:.1f} GiB free, {held} (a leftover job?)")
        elif free < MEMORY_WARN_FREE * total:
            warns.append(f"{what}: {held}")
    if gpu.get("slowdowns"):
        warns.append(f"{what}: clocks held down ({', '.join(gpu['slowdowns'])})")
    width, max_width = gpu.get("pcie_width"), gpu.get("pcie_max_width")
    if width and max_width and width < max_width:
        warns.append(f"{what}: PCIe link x{width}, below its x{max_width}")
    gen, max_gen = gpu.get("pcie_gen"), gpu.get("pcie_max_gen")
    # an idle GPU lowers its link generation to save power: only a busy one's is worth a word
    if gen and max_gen and gen < max_gen and not gpu.get("idle"):
        warns.append(f"{what}: PCIe gen {gen}, below its gen {max_gen}")
    return fails, warns


def nvml_slowdowns(reasons: int | None) -> tuple[list[str] | None, bool | None]:
    """(the slowdowns named in an NVML clocks-event bitmask, whether it says idle); (None, None) when not read."""
    if reasons is None:
        return None, None
    return [text for bit, text in NVML_SLOWDOWNS.items() if reasons & bit], bool(reasons & NVML_IDLE)


def pcie_gen(rate) -> int | None:
    """The generation of a link running at `rate`, in GT/s or (as amdsmi gives it) MT/s; None for an unread one."""
    if not isinstance(rate, (int, float)) or rate <= 0:
        return None
    gts = rate / 1000 if rate >= 1000 else rate
    return max((gen for speed, gen in PCIE_GENERATIONS.items() if gts >= speed * 0.99), default=None)


def read_gpus() -> tuple[list[dict], str]:
    """This node's GPUs' readings, and which library answered or why none did (CPU nodes: none)."""
    gpus, nvml = _read_nvml()
    if gpus:
        return gpus, nvml
    gpus, amd = _read_amd()
    return (gpus, amd) if gpus else ([], f"{nvml}; {amd}")


def _read_nvml() -> tuple[list[dict], str]:
    with gpu_libraries.nvml() as (nv, why):
        if nv is None:
            return [], why
        try:
            return [_nvml_gpu(nv, i) for i in range(nv.nvmlDeviceGetCount())], "NVML"
        except nv.NVMLError as e:
            return [], f"NVML error ({e})"


def _asker(error: type, module, handle):
    def ask(fn_name: str, *args):
        """None where this GPU or driver does not support the query (ECC off, no row remapper, old library)."""
        fn = getattr(module, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(handle, *args)
        except error:
            return None

    return ask


def _nvml_gpu(nv, index: int) -> dict:
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(index)
    except nv.NVMLError as e:  # a GPU fallen off the bus is counted but cannot be opened
        return {"index": index, "vendor": "nvidia", "error": str(e)}
    ask = _asker(nv.NVMLError, nv, handle)
    remapped = ask("nvmlDeviceGetRemappedRows")  # (corrected, uncorrected, pending, failure): Ampere and newer
    reasons = ask("nvmlDeviceGetCurrentClocksEventReasons")
    if reasons is None:  # the older name of the same query
        reasons = ask("nvmlDeviceGetCurrentClocksThrottleReasons")
    slowdowns, idle = nvml_slowdowns(reasons)
    pending = ask("nvmlDeviceGetRetiredPagesPendingStatus")
    gpu_name = ask("nvmlDeviceGetName")
    mig = ask("nvmlDeviceGetMigMode")  # (current, pending)
    memory = None if mig and mig[0] == nv.NVML_DEVICE_MIG_ENABLE else ask("nvmlDeviceGetMemoryInfo")
    return {
        "index": index,
        "vendor": "nvidia",
        "name": _text(gpu_name) if gpu_name is not None else "",
        "ecc_uncorrected": ask(
            "nvmlDeviceGetTotalEccErrors", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
        ),
        "retired_pages_pending": None if pending is None else pending == nv.NVML_FEATURE_ENABLED,
        "remap_pending": None if remapped is None else bool(remapped[2]),
        "remap_failed": None if remapped is None else bool(remapped[3]),
        "clock_reasons": reasons,
        "slowdowns": slowdowns,
        "idle": idle,
        "pcie_width": ask("nvmlDeviceGetCurrPcieLinkWidth"),
        "pcie_max_width": ask("nvmlDeviceGetMaxPcieLinkWidth"),
        "pcie_gen": ask("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_max_gen": ask("nvmlDeviceGetMaxPcieLinkGeneration"),
        "memory_total": None if memory is None else memory.total,
        "memory_used": None if memory is None else memory.used,
    }


def _read_amd() -> tuple[list[dict], str]:
    with gpu_libraries.amdsmi() as (amd, why):
        if amd is None:
            return [], why
        try:
            return [_amd_gpu(amd, i, h) for i, h in enumerate(amd.amdsmi_get_processor_handles())], "amdsmi"
        except amd.AmdSmiException as e:
            return [], f"amdsmi error ({e})"


def _number(value):
    """amdsmi says "N/A" (a string) for a field this GPU does not fill."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _amd_gpu(amd, index: int, handle) -> dict:
    ask = _asker(amd.AmdSmiException, amd, handle)
    ecc = ask("amdsmi_get_gpu_total_ecc_count") or {}
    pages = ask("amdsmi_get_gpu_bad_page_info")
    status = [p.get("status") for p in pages or []]
    violations = ask("amdsmi_get_violation_status")  # MI300 and newer, amdsmi 6.3 and newer
    activity = ask("amdsmi_get_gpu_activity") or {}
    busy = _number(activity.get("gfx_activity"))
    pcie = ask("amdsmi_get_pcie_info") or {}
    static, now = pcie.get("pcie_static") or {}, pcie.get("pcie_metric") or {}
    vram = amd.AmdSmiMemoryType.VRAM
    total, used = _number(ask("amdsmi_get_gpu_memory_total", vram)), _number(ask("amdsmi_get_gpu_memory_usage", vram))
    # AMD GPUs narrow their link as well as slow it when idle: the current link says something only under load
    loaded = bool(busy)
    return {
        "index": index,
        "vendor": "amd",
        "name": _amd_model(amd, handle),
        "ecc_uncorrected": _number(ecc.get("uncorrectable_count")),
        "retired_pages_pending": None if pages is None else amd.AmdSmiMemoryPageStatus.PENDING in status,
        "retire_failed": None if pages is None else amd.AmdSmiMemoryPageStatus.UNRESERVABLE in status,
        "slowdowns": None
        if violations is None
        else [text for key, text in AMD_SLOWDOWNS.items() if violations.get(key) is True],
        "idle": None if busy is None else not busy,
        "pcie_width": _number(now.get("pcie_width")) if loaded else None,
        "pcie_max_width": _number(static.get("max_pcie_width")),
        "pcie_gen": pcie_gen(now.get("pcie_speed")) if loaded else None,
        "pcie_max_gen": pcie_gen(static.get("max_pcie_speed")),
        "memory_total": total,
        "memory_used": used,
    }
