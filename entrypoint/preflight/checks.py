"""Checks that run before Ray starts. Each failure names the variable and the fix.

Every check reads an Inventory (what the machine has), the spec and the environment, never the
machine itself, so each branch is unit tested with a made-up inventory.

Adding a check: a function `check_<what>(...)` that takes what it needs of (spec, env, inv, temp_dir) and a
Preflight, adds one Check per finding (pf.add(name, PASS|WARN|FAIL, message); a FAIL message says the variable
and the fix, since it becomes the one-line error), may fill the Preflight's fields that `ray start` uses, and
raises nothing; then a call in `run`, in the order the findings should read, and its cases in
tests/unit/entrypoint/test_preflight.py.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..detect.nodespec import NodeSpec
from .inventory import INFINIBAND_DIR, Gpu, Inventory

PASS, WARN, FAIL = "pass", "warn", "fail"
GiB = 1024**3
# Ray's object store default: 30% of memory. Below this /dev/shm it spills to disk and slows down.
OBJECT_STORE_FRACTION = 0.3
MIN_OBJECT_STORE = 256 * 1024**2
NOFILE_WANTED = 65536
TEMP_FREE_FAIL = 1 * GiB
TEMP_FREE_WARN = 10 * GiB
# The oldest Linux driver that runs any release of a CUDA major version (NVIDIA's minor-version compatibility table):
# PyPI's torch and vLLM wheels carry their CUDA libraries, so the host's driver is the one thing left to match.
MIN_DRIVER_FOR_CUDA = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# GPU-<uuid>, MIG-<uuid>, the old MIG-GPU-<uuid>/<gi>/<ci>, or a bare UUID (AMD)
UUID_RE = re.compile(r"^(GPU-|MIG-(GPU-)?)[0-9a-fA-F-]+(/\d+/\d+)?$|^[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}$")


@dataclass
class Check:
    """One finding: `name` (what was checked, often the variable), `status` (PASS, WARN or FAIL) and `message`
    (for a FAIL: what is wrong and how to fix it, as the user will read it)."""

    name: str
    status: str
    message: str

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "message": self.message}


@dataclass
class Preflight:
    """Every finding in order, and what the checks decided for `ray start` (GPUs, CPUs, object store, variables
    set before it starts, the GPU model, custom resources). Any FAIL stops `rlrig run|train|up` before Ray starts;
    `rlrig doctor` shows them all."""

    checks: list[Check] = field(default_factory=list)
    num_gpus: int = 0
    num_cpus: int = 1
    object_store_bytes: int | None = None
    env_updates: dict[str, str] = field(default_factory=dict)  # set on this node before Ray starts
    gpu_model: str = ""  # of the GPUs Ray gets ("" when none, or the driver would not say)
    custom_resources: dict[str, float] = field(default_factory=dict)  # RLRIG_RESOURCES (resources.py)
    mig_devices: int = 0  # NVIDIA MIG devices named in CUDA_VISIBLE_DEVICES (each one GPU to Ray, one per worker)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def add(self, name: str, status: str, message: str) -> None:
        self.checks.append(Check(name, status, message))


def _visible_list(var: str, value: str, inv: Inventory, pf: Preflight) -> list[str] | None:
    """Validate one *_VISIBLE_DEVICES value; returns its entries or None when invalid."""
    entries = [e.strip() for e in value.split(",")] if value.strip() else []
    fix = f"set {var} to distinct GPU indices or UUIDs, e.g. {var}=0,1"
    bad = [e for e in entries if not (e.isdigit() or UUID_RE.match(e))]
    if bad:
        pf.add(var, FAIL, f"{var}={value}: {bad[0]!r} is neither a GPU index nor a GPU UUID; {fix}")
        return None
    dups = sorted({e for e in entries if entries.count(e) > 1})
    if dups:
        pf.add(
            var, FAIL, f'{var}={value} lists {", ".join(dups)} more than once ("invalid device ordinal" later); {fix}'
        )
        return None
    if inv.gpus:
        n = len(inv.gpus)
        beyond = [e for e in entries if e.isdigit() and int(e) >= n]
        if beyond:
            pf.add(var, FAIL, f"{var}={value}: index {beyond[0]} but this node has {n} GPU(s) (0..{n - 1}); {fix}")
            return None
        unknown = [e for e in entries if not e.isdigit() and not any(_is_entry(g, e) for g in inv.gpus)]
        if unknown:
            pf.add(
                var,
                FAIL,
                f"{var}={value}: {unknown[0]} is not a GPU or MIG device on this node (see nvidia-smi -L); {fix}",
            )
            return None
    pf.add(var, PASS, f"{var}={value} ({len(entries)} device(s))")
    return entries


def _is_entry(gpu: Gpu, entry: str) -> bool:
    """`entry` (an index, a UUID or its unique prefix, a MIG device's UUID, or the old MIG-GPU-<uuid>/gi/ci form)
    names this GPU or one of its MIG devices."""
    if entry.isdigit():
        return gpu.index == int(entry)
    if entry.startswith("MIG-GPU-"):
        return gpu.mig and entry[len("MIG-") :].split("/")[0] == gpu.uuid
    return any(u.startswith(entry) or entry.startswith(u) for u in (gpu.uuid, *gpu.mig_devices))


def check_mig(visible: list[str] | None, inv: Inventory, pf: Preflight) -> bool:
    """MIG: a CUDA process sees one MIG device, so each Ray worker must be handed one by its UUID. False (a failed
    check added) when CUDA_VISIBLE_DEVICES mixes MIG devices and GPUs, or names a MIG-mode GPU as a whole."""
    named = [e for e in visible or [] if e.startswith("MIG-")]
    if named and len(named) != len(visible):
        pf.add(
            "MIG",
            FAIL,
            f"CUDA_VISIBLE_DEVICES={','.join(visible)} mixes MIG devices and whole GPUs; list only "
            "MIG device UUIDs (one per worker) or only GPUs",
        )
        return False
    whole = (
        inv.gpus
        if visible is None
        else [g for e in visible if not e.startswith("MIG-") for g in inv.gpus if _is_entry(g, e)]
    )
    for g in whole:
        if g.mig and len(g.mig_devices) != 1:
            example = ",".join(g.mig_devices[:2]) or "MIG-<uuid> (create instances first: nvidia-smi mig -cgi ... -C)"
            pf.add(
                "MIG",
                FAIL,
                f"GPU {g.index} ({g.uuid}) is in MIG mode with {len(g.mig_devices)} MIG device(s): a "
                "process sees one of them, not the GPU, so Ray would count a GPU that is not there; set "
                f"CUDA_VISIBLE_DEVICES to MIG device UUIDs (nvidia-smi -L), e.g. CUDA_VISIBLE_DEVICES={example}, "
                f"or turn MIG off (nvidia-smi -i {g.index} -mig 0)",
            )
            return False
    if named:
        pf.mig_devices = len(named)
        pf.add("MIG", PASS, f"{len(named)} MIG device(s), one per worker (NCCL does not run between MIG devices)")
    return True


def gpu_model(visible: list[str] | None, inv: Inventory, count: int) -> str:
    """The model of the first `count` GPUs Ray will see (the visible ones, in their order); a node
    with several models names each, so that no label claims one model for all."""
    gpus = inv.gpus if visible is None else [g for e in visible for g in inv.gpus if _is_entry(g, e)]
    models = list(dict.fromkeys(g.model for g in gpus[:count] if g.model))
    return "_".join(models)


def check_gpus(spec: NodeSpec, env: Mapping[str, str], inv: Inventory, pf: Preflight) -> None:
    cuda, hip, rocr = (env.get(v) for v in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"))
    if rocr is not None and (hip is not None or cuda is not None):
        other = "HIP_VISIBLE_DEVICES" if hip is not None else "CUDA_VISIBLE_DEVICES"
        pf.add(
            "ROCR_VISIBLE_DEVICES",
            FAIL,
            f"ROCR_VISIBLE_DEVICES is set together with {other}; Ray >= 2.45 refuses this: "
            f"unset ROCR_VISIBLE_DEVICES and select GPUs with HIP_VISIBLE_DEVICES",
        )
        return
    visible: list[str] | None = None
    for var, value in (("CUDA_VISIBLE_DEVICES", cuda), ("HIP_VISIBLE_DEVICES", hip), ("ROCR_VISIBLE_DEVICES", rocr)):
        if value is None:
            continue
        entries = _visible_list(var, value, inv, pf)
        if entries is None:
            return
        if visible is not None and entries != visible:
            pf.add(
                var,
                FAIL,
                f"{var}={value} disagrees with CUDA_VISIBLE_DEVICES={cuda}; "
                f"set only HIP_VISIBLE_DEVICES on ROCm (or make both identical)",
            )
            return
        visible = entries
    amd_possible = not inv.gpus or any(g.vendor == "amd" for g in inv.gpus)
    if hip is None and rocr is not None and amd_possible:
        pf.add(
            "ROCR_VISIBLE_DEVICES",
            FAIL,
            f"ROCR_VISIBLE_DEVICES={rocr} alone: Ray refuses it on AMD GPUs; set "
            f"HIP_VISIBLE_DEVICES={rocr} and unset ROCR_VISIBLE_DEVICES",
        )
        return
    if not check_mig(visible if cuda is not None else None, inv, pf):
        return
    count = len(visible) if visible is not None else len(inv.gpus)
    if visible is not None and not inv.gpus and count and spec.gpus_allotted is None:
        pf.add("gpus", WARN, f"visible-devices variables list {count} GPU(s) but no GPU was found ({inv.gpu_probe})")
        count = 0
    pf.num_gpus = count
    allotted = spec.gpus_allotted
    if allotted is not None and count < allotted:
        pf.add(
            "gpus",
            FAIL,
            f"{spec.launcher} allotted {allotted} GPU(s) to this node but {count} are visible "
            f"({inv.gpu_probe or 'no probe'}); check CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES "
            "and the container's GPU flags (--gpus all / --device /dev/kfd --device /dev/dri)",
        )
    elif allotted is not None and count > allotted:
        pf.add(
            "gpus", WARN, f"{count} GPUs are visible but {spec.launcher} allotted {allotted}; Ray will use {allotted}"
        )
        pf.num_gpus = allotted
    else:
        pf.add("gpus", PASS, f"{count} GPU(s) ({inv.gpu_probe or 'no probe'})")
    pf.gpu_model = gpu_model(visible, inv, pf.num_gpus)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def check_driver(inv: Inventory, pf: Preflight) -> None:
    """NVML's driver against what the installed torch's CUDA build needs: an old driver otherwise shows up as
    `torch.cuda.is_available() == False` (or a CUDA error 803/804) deep inside a Ray worker."""
    if not inv.nvidia_driver or not inv.torch_cuda:
        return
    cuda_major = _version(inv.torch_cuda)[0]
    needed = MIN_DRIVER_FOR_CUDA.get(cuda_major)
    if needed is None:
        pf.add(
            "NVIDIA driver",
            WARN,
            f"torch is built for CUDA {inv.torch_cuda}, which rlrig has no driver minimum for; "
            f"check NVIDIA's compatibility table against driver {inv.nvidia_driver}",
        )
    elif _version(inv.nvidia_driver) < _version(needed):
        older = cuda_major - 1
        instead = (
            f", or install a torch built for CUDA {older} (its driver minimum is {MIN_DRIVER_FOR_CUDA[older]})"
            if older in MIN_DRIVER_FOR_CUDA and _version(inv.nvidia_driver) >= _version(MIN_DRIVER_FOR_CUDA[older])
            else ""
        )
        pf.add(
            "NVIDIA driver",
            FAIL,
            f"NVIDIA driver {inv.nvidia_driver} is older than torch's CUDA {inv.torch_cuda} "
            f"build needs ({needed} or newer): update the host's driver{instead}",
        )
    else:
        pf.add("NVIDIA driver", PASS, f"{inv.nvidia_driver} runs torch's CUDA {inv.torch_cuda} build (needs {needed}+)")


def _iface_names(inv: Inventory) -> list[str]:
    return [i.name for i in inv.interfaces]


def nccl_ifname_matches(value: str, names: list[str]) -> list[str]:
    """Interfaces NCCL would use for NCCL_SOCKET_IFNAME: prefixes, `=` exact, `^` excludes."""
    exclude = value.startswith("^")
    body = value[1:] if exclude else value
    exact = body.startswith("=")
    body = body[1:] if exact else body
    pats = [p for p in body.split(",") if p]

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in pats)

    return [n for n in names if (not hit(n)) == exclude and not (exclude and n == "lo")]


def check_network(spec: NodeSpec, env: Mapping[str, str], inv: Inventory, pf: Preflight) -> None:
    names = _iface_names(inv)
    nccl = env.get("NCCL_SOCKET_IFNAME")
    if nccl:
        used = nccl_ifname_matches(nccl, names)
        if not used:
            pf.add(
                "NCCL_SOCKET_IFNAME",
                FAIL,
                f"NCCL_SOCKET_IFNAME={nccl} matches no interface here ({', '.join(names)}); "
                f"set it to the interface that reaches the head"
                + (f", e.g. NCCL_SOCKET_IFNAME={spec.interface}" if spec.interface else ""),
            )
        elif spec.nnodes > 1 and spec.interface and spec.interface not in used:
            pf.add(
                "NCCL_SOCKET_IFNAME",
                WARN,
                f"NCCL_SOCKET_IFNAME={nccl} selects {', '.join(used)}, not {spec.interface} "
                "which carries the route to the head",
            )
        else:
            pf.add("NCCL_SOCKET_IFNAME", PASS, f"NCCL_SOCKET_IFNAME={nccl} -> {', '.join(used)}")
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if gloo:
        if gloo.startswith("^"):
            pf.add(
                "GLOO_SOCKET_IFNAME",
                FAIL,
                f"GLOO_SOCKET_IFNAME={gloo}: Gloo has no '^' exclusion syntax; "
                f"name one interface" + (f", e.g. GLOO_SOCKET_IFNAME={spec.interface}" if spec.interface else ""),
            )
        else:
            missing = [n for n in gloo.split(",") if n not in names]
            if missing:
                pf.add(
                    "GLOO_SOCKET_IFNAME",
                    FAIL,
                    f"GLOO_SOCKET_IFNAME={gloo}: no interface named {missing[0]} here "
                    f"({', '.join(names)}); Gloo needs an exact interface name",
                )
            else:
                pf.add("GLOO_SOCKET_IFNAME", PASS, f"GLOO_SOCKET_IFNAME={gloo}")
    hca = env.get("NCCL_IB_HCA")
    if hca:
        ib_dir, devices = INFINIBAND_DIR, inv.ib_devices
        body = hca.lstrip("^")
        exact = body.startswith("=")
        wanted = [p.split(":")[0] for p in body.lstrip("=").split(",") if p]
        if not devices:
            pf.add(
                "NCCL_IB_HCA",
                FAIL,
                f"NCCL_IB_HCA={hca} but {ib_dir} lists no InfiniBand device; "
                "unset NCCL_IB_HCA (and set NCCL_IB_DISABLE=1 to use sockets)",
            )
        elif not hca.startswith("^"):
            missing = [w for w in wanted if not any(d == w if exact else d.startswith(w) for d in devices)]
            if missing:
                pf.add(
                    "NCCL_IB_HCA",
                    FAIL,
                    f"NCCL_IB_HCA={hca}: no HCA {missing[0]} in {ib_dir} ({', '.join(devices)}); "
                    "fix the name or unset NCCL_IB_HCA",
                )
            else:
                pf.add("NCCL_IB_HCA", PASS, f"NCCL_IB_HCA={hca} ({', '.join(devices)})")
        else:
            pf.add("NCCL_IB_HCA", PASS, f"NCCL_IB_HCA={hca} ({', '.join(devices)})")
    if spec.nnodes > 1 and spec.interface and not ipaddress.ip_address(spec.node_ip).is_loopback:
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            if not env.get(var):
                pf.env_updates[var] = spec.interface
                pf.add(var, PASS, f"{var} unset: set to {spec.interface}, the interface of the route to the head")


def check_reachability(spec: NodeSpec, inv: Inventory, pf: Preflight) -> None:
    """A container on a Docker bridge advertises 172.17.x, which other hosts cannot reach."""
    if spec.nnodes < 2 or not spec.node_ip or not spec.head_address:
        return
    ip = ipaddress.ip_address(spec.node_ip)
    itf = next((i for i in inv.interfaces if any(a == spec.node_ip for a, _ in i.addresses)), None)
    prefix = next((p for a, p in itf.addresses if a == spec.node_ip), 32) if itf else 32
    same_subnet = ipaddress.ip_address(spec.head_address) in ipaddress.ip_network(
        f"{spec.node_ip}/{prefix}", strict=False
    )
    bridge_like = ip.version == 4 and ip in ipaddress.ip_network("172.16.0.0/12")
    if inv.in_container and bridge_like and not same_subnet and not spec.is_head:
        pf.add(
            "node_ip",
            FAIL,
            f"this container would advertise {spec.node_ip} (a Docker bridge address) which the head "
            f"{spec.head_address} cannot reach; run the container with --network host "
            "(or set RLRIG_NODE_IP to a routable address)",
        )
    else:
        pf.add("node_ip", PASS, f"{spec.node_ip} on {spec.interface or '?'}")


def check_resources(spec: NodeSpec, inv: Inventory, pf: Preflight) -> None:
    pf.num_cpus = (
        inv.cpu_count if spec.cpus_allotted is None else min(spec.cpus_allotted, inv.cpu_count) or spec.cpus_allotted
    )
    pf.add(
        "cpus",
        PASS,
        f"{pf.num_cpus} CPU(s) for Ray"
        + (f" ({spec.launcher} allotted {spec.cpus_allotted})" if spec.cpus_allotted else ""),
    )
    wanted = max(MIN_OBJECT_STORE, int(inv.memory_bytes * OBJECT_STORE_FRACTION))
    if inv.shm_bytes is None:
        pf.add("/dev/shm", WARN, "no /dev/shm: Ray's object store will use disk and be slow")
    elif inv.shm_bytes < MIN_OBJECT_STORE:
        pf.add(
            "/dev/shm",
            FAIL,
            f"/dev/shm has {inv.shm_bytes / GiB:.2f} GiB free, below Ray's minimum object store; "
            "give the container more (docker --shm-size=16g, compose shm_size, dstack resources.shm_size)",
        )
    elif inv.shm_bytes < wanted:
        pf.object_store_bytes = int(inv.shm_bytes * 0.8)
        pf.add(
            "/dev/shm",
            WARN,
            f"/dev/shm has {inv.shm_bytes / GiB:.1f} GiB free, less than the {wanted / GiB:.1f} GiB object store "
            f"Ray would use; capped at {pf.object_store_bytes / GiB:.1f} GiB. Raise it with --shm-size",
        )
    else:
        pf.object_store_bytes = wanted
        pf.add("/dev/shm", PASS, f"{inv.shm_bytes / GiB:.1f} GiB free; object store {wanted / GiB:.1f} GiB")
    if inv.nofile_soft and inv.nofile_soft < NOFILE_WANTED:
        status = WARN if inv.nofile_soft >= 1024 else FAIL
        pf.add(
            "ulimit -n",
            status,
            f"open-files limit is {inv.nofile_soft} (hard {inv.nofile_hard}); Ray wants {NOFILE_WANTED}: "
            "`ulimit -n 65536` or docker --ulimit nofile=65536:65536",
        )
    else:
        pf.add("ulimit -n", PASS, f"open-files limit {inv.nofile_soft}")
    if inv.temp_free_bytes is not None:
        free = inv.temp_free_bytes / GiB
        if inv.temp_free_bytes < TEMP_FREE_FAIL:
            pf.add("temp dir", FAIL, f"{free:.1f} GiB free in the Ray temp dir; set RAY_TMPDIR to a disk with room")
        elif inv.temp_free_bytes < TEMP_FREE_WARN:
            pf.add(
                "temp dir",
                WARN,
                f"only {free:.1f} GiB free in the Ray temp dir (logs and spilled objects); consider RAY_TMPDIR",
            )
        else:
            pf.add("temp dir", PASS, f"{free:.0f} GiB free")


# Ray puts Unix sockets at <temp>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store (64 bytes
# after <temp>), and a socket path may be at most 107 bytes.
TEMP_DIR_MAX = 107 - 64


def check_temp_dir(temp_dir: str, pf: Preflight) -> None:
    if len(temp_dir) > TEMP_DIR_MAX:
        pf.add(
            "temp dir path",
            FAIL,
            f"Ray temp dir {temp_dir} is {len(temp_dir)} characters; Ray's socket paths below it "
            "would pass the 107-byte limit. Set RAY_TMPDIR (or --temp-dir) "
            f"to a path of at most {TEMP_DIR_MAX - 20} characters",
        )


def run(
    spec: NodeSpec, env: Mapping[str, str], inv: Inventory, temp_dir: str = "", pf: Preflight | None = None
) -> Preflight:
    """Every check, in order, into `pf` (a fresh one unless given: detection may have filled it)."""
    pf = Preflight() if pf is None else pf
    check_temp_dir(temp_dir, pf)
    check_gpus(spec, env, inv, pf)
    check_driver(inv, pf)
    check_network(spec, env, inv, pf)
    check_reachability(spec, inv, pf)
    check_resources(spec, inv, pf)
    return pf
