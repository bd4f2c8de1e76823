"""What this machine has, read once, so that every preflight check can be fed a fake one in tests."""

from __future__ import annotations

import importlib.util
import os
import re
import resource
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..detect.addresses import Interface, local_interfaces
from . import gpu_libraries


@dataclass
class Gpu:
    index: int
    uuid: str
    vendor: str  # "nvidia" | "amd"
    model: str = ""  # as the driver names it ("NVIDIA H100 80GB HBM3"); "" when it would not say
    mig: bool = False  # NVIDIA MIG mode is on: CUDA then sees the GPU's MIG devices, one per process, not the GPU
    mig_devices: list[str] = field(default_factory=list)  # their UUIDs ("MIG-..."), as nvidia-smi -L lists them


@dataclass
class Inventory:
    gpus: list[Gpu] = field(default_factory=list)
    gpu_probe: str = ""  # which library answered, or why none did
    nvidia_driver: str = ""  # the host's driver as NVML reports it ("580.65.06"); "" without NVIDIA GPUs
    torch_cuda: str = ""  # the CUDA version the installed torch was built for ("13.0"); "" for CPU/ROCm builds
    interfaces: list[Interface] = field(default_factory=list)
    ib_devices: list[str] = field(default_factory=list)  # names under INFINIBAND_DIR
    shm_bytes: int | None = None  # free space in /dev/shm
    memory_bytes: int = 0  # available memory
    nofile_soft: int = 0
    nofile_hard: int = 0
    temp_free_bytes: int | None = None
    cpu_count: int = 1
    in_container: bool = False  # Docker, Podman or Apptainer: a bridge address may be unreachable


INFINIBAND_DIR = Path("/sys/class/infiniband")
CONTAINER_FILES = ("/.dockerenv", "/run/.containerenv")  # Docker's and Podman's


def probe_nvidia() -> tuple[list[Gpu], str, str]:
    """The GPUs, which library answered (or why none did), and the driver's version."""
    with gpu_libraries.nvml() as (pynvml, why):
        if pynvml is None:
            return [], why, ""
        try:
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid, name = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
                mig, mig_devices = _mig_devices(pynvml, handle)
                gpus.append(Gpu(i, _text(uuid), "nvidia", _text(name), mig, mig_devices))
            return gpus, "NVML", _text(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError as e:  # a GPU fallen off the bus answers init but not its queries
            return [], f"NVML error ({e})", ""


def _mig_devices(pynvml, handle) -> tuple[bool, list[str]]:
    """(MIG mode on, the UUIDs of the MIG devices made on it). GPUs without MIG answer NotSupported."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError_NotSupported:
        return False, []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return False, []
    uuids = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:  # an empty slot: no instance made there
            continue
        uuids.append(_text(pynvml.nvmlDeviceGetUUID(mig)))
    return True, uuids


def torch_cuda_build() -> str:
    """The CUDA version of the installed torch, read from torch/version.py as text: importing torch costs seconds
    that doctor should not spend, and a torch that fails to import still names the CUDA it was built for."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ""
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return ""
    found = re.search(r"^cuda(?:\s*:\s*[\w\[\]]+)?\s*=\s*['\"]([\d.]+)['\"]", text, re.M)
    return found.group(1) if found else ""


def _text(value) -> str:
    """Older pynvml returns bytes, newer str."""
    return value.decode() if isinstance(value, bytes) else value


def _amd_model(amdsmi, handle) -> str:
    try:
        return str(amdsmi.amdsmi_get_gpu_asic_info(handle).get("market_name") or "")
    except amdsmi.AmdSmiException:  # the model only names a label: a GPU that will not say still counts
        return ""


def probe_amd() -> tuple[list[Gpu], str]:
    with gpu_libraries.amdsmi() as (amdsmi, why):
        if amdsmi is None:
            return [], why
        try:
            handles = amdsmi.amdsmi_get_processor_handles()
            return [
                Gpu(i, str(amdsmi.amdsmi_get_gpu_device_uuid(h)), "amd", _amd_model(amdsmi, h))
                for i, h in enumerate(handles)
            ], "amdsmi"
        except amdsmi.AmdSmiException as e:
            return [], f"amdsmi error ({e})"


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs allowed by a cgroup quota (v2 cpu.max or v1 cfs quota), None when unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """min(affinity mask, cgroup quota): Ray reads os.cpu_count(), which overcounts under Slurm."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit()
    if quota:
        n = min(n, max(1, int(quota)))
    return n


def _free_bytes(path: str) -> int | None:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def infiniband_devices(root: Path = INFINIBAND_DIR) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def in_container(env: Mapping[str, str], files=CONTAINER_FILES) -> bool:
    return any(os.path.exists(p) for p in files) or bool(env.get("APPTAINER_CONTAINER"))


def collect(temp_dir: str, env: Mapping[str, str]) -> Inventory:
    import psutil

    gpus, probe, driver = probe_nvidia()
    if not gpus:
        amd, amd_probe = probe_amd()
        if amd:
            gpus, probe = amd, amd_probe
        else:
            probe = f"{probe}; {amd_probe}"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return Inventory(
        gpus=gpus,
        gpu_probe=probe,
        nvidia_driver=driver,
        torch_cuda=torch_cuda_build(),
        interfaces=local_interfaces(),
        ib_devices=infiniband_devices(),
        shm_bytes=_free_bytes("/dev/shm") if os.path.isdir("/dev/shm") else None,
        memory_bytes=psutil.virtual_memory().available,
        nofile_soft=soft,
        nofile_hard=hard,
        temp_free_bytes=_free_bytes(temp_dir),
        cpu_count=usable_cpus(),
        in_container=in_container(env),
    )
