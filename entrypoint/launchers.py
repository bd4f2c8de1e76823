"""One small class per launcher: how to recognise it and what it tells this node.

Adding a launcher means adding a class here and a row to tests/unit/test_launchers.py.
Each class reads only the environment (and the files it names); address resolution and
validation happen later, in addresses.py and preflight.py.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Mapping

from .errors import RigError
from .hostlist import HostlistError, expand_hostlist
from .nodespec import NodeSpec


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise RigError(f"{name}={raw!r} is not an integer; unset it or set a whole number") from None


def _unique(seq) -> list[str]:
    return list(dict.fromkeys(seq))


def _host_index(hosts: list[str], hostname: str, source: str) -> int:
    candidates = {hostname, hostname.split(".")[0]}
    for i, h in enumerate(hosts):
        if h in candidates or h.split(".")[0] in candidates:
            return i
    raise RigError(
        f"this host ({hostname}) is not in {source} ({', '.join(hosts[:4])}...); "
        "set RLRIG_NODE_RANK for this node"
    )


class Launcher:
    name = ""
    markers: tuple[str, ...] = ()  # all of these must be set for detect() to claim the env

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return all(env.get(m) for m in cls.markers)

    @classmethod
    def spec(cls, env: Mapping[str, str], hostname: str) -> NodeSpec:
        raise NotImplementedError


class Dstack(Launcher):
    name = "dstack"
    markers = ("DSTACK_NODE_RANK",)

    @classmethod
    def spec(cls, env, hostname):
        rank = _int(env, "DSTACK_NODE_RANK")
        ips = [ip.strip() for ip in env.get("DSTACK_NODES_IPS", "").split("\n") if ip.strip()]
        return NodeSpec(
            launcher=cls.name,
            node_rank=rank,
            nnodes=_int(env, "DSTACK_NODES_NUM", 1),
            head_host=env.get("DSTACK_MASTER_NODE_IP") or (ips[0] if ips else ""),
            gpus_allotted=_int(env, "DSTACK_GPUS_PER_NODE"),
            job_id=env.get("DSTACK_RUN_NAME", ""),
            node_ip_hint=ips[rank] if rank is not None and rank < len(ips) else "",
        )


class SkyPilot(Launcher):
    name = "skypilot"
    markers = ("SKYPILOT_NODE_RANK",)

    @classmethod
    def spec(cls, env, hostname):
        ips = [ip.strip() for ip in env.get("SKYPILOT_NODE_IPS", "").split("\n") if ip.strip()]
        rank = _int(env, "SKYPILOT_NODE_RANK")
        return NodeSpec(
            launcher=cls.name,
            node_rank=rank,
            nnodes=_int(env, "SKYPILOT_NUM_NODES", 1),
            head_host=ips[0] if ips else "",
            gpus_allotted=_int(env, "SKYPILOT_NUM_GPUS_PER_NODE"),
            job_id=env.get("SKYPILOT_TASK_ID", ""),
            node_ip_hint=ips[rank] if rank < len(ips) else "",
            # SkyPilot's own Ray holds 6380/8266/52365; ours must not collide or `ray stop` it.
            ray_start_args=["--dashboard-agent-listen-port=52366"],
        )


class KubeRay(Launcher):
    name = "kuberay"

    @classmethod
    def detect(cls, env):
        return bool(env.get("KUBERAY_GEN_RAY_START_CMD") or env.get("RAY_CLUSTER_NAME"))

    @classmethod
    def spec(cls, env, hostname):
        return NodeSpec(
            launcher=cls.name,
            node_rank=0,
            nnodes=1,
            head_host="",
            existing_ray=env.get("RAY_ADDRESS") or "auto",  # the operator started Ray: start nothing
        )


class LeaderWorkerSet(Launcher):
    name = "lws"
    markers = ("LWS_LEADER_ADDRESS",)

    @classmethod
    def spec(cls, env, hostname):
        return NodeSpec(
            launcher=cls.name,
            node_rank=_int(env, "LWS_WORKER_INDEX", 0),
            nnodes=_int(env, "LWS_GROUP_SIZE", 1),
            head_host=env["LWS_LEADER_ADDRESS"],
        )


class TorchRun(Launcher):
    name = "torchrun"
    markers = ("TORCHELASTIC_RUN_ID",)

    @classmethod
    def spec(cls, env, hostname):
        local = _int(env, "LOCAL_WORLD_SIZE", 1)
        if local != 1:
            raise RigError(
                f"torchrun started LOCAL_WORLD_SIZE={local} processes on this node but rlrig needs one "
                "per node; launch it with `torchrun --nproc-per-node=1 ...`"
            )
        world = _int(env, "WORLD_SIZE", 1)
        return NodeSpec(
            launcher=cls.name,
            node_rank=_int(env, "GROUP_RANK", 0),
            nnodes=world // local,
            head_host=env.get("MASTER_ADDR", ""),
            job_id=env.get("TORCHELASTIC_RUN_ID", ""),
        )


class PyTorchJob(Launcher):
    name = "pytorchjob"
    markers = ("MASTER_ADDR", "RANK")

    @classmethod
    def spec(cls, env, hostname):
        rank = _int(env, "PET_NODE_RANK")
        return NodeSpec(
            launcher=cls.name,
            node_rank=rank if rank is not None else _int(env, "RANK"),
            nnodes=_int(env, "PET_NNODES") or _int(env, "WORLD_SIZE", 1),
            head_host=env["MASTER_ADDR"],
            gpus_allotted=_int(env, "PET_NPROC_PER_NODE") if (env.get("PET_NPROC_PER_NODE") or "").isdigit() else None,
        )


def _slurm_tasks_per_node(value: str) -> int:
    # SLURM_TASKS_PER_NODE looks like "1(x2),2": the largest count is what matters here.
    counts = [int(m.group(1)) for m in re.finditer(r"(\d+)(?:\(x\d+\))?", value)]
    return max(counts) if counts else 1


class Slurm(Launcher):
    name = "slurm"

    @classmethod
    def detect(cls, env):
        # A batch script of `sbatch -N2` has neither SLURM_NTASKS nor SLURM_STEP_ID (seen on slurm-wlm 22.05):
        # the job id alone must count, or rlrig would start a lone local cluster there.
        return bool(env.get("SLURM_JOB_ID"))

    @classmethod
    def spec(cls, env, hostname):
        in_step = bool(env.get("SLURM_STEP_ID")) and env.get("SLURM_STEP_ID") != "batch"
        job_nodes = _int(env, "SLURM_JOB_NUM_NODES") or _int(env, "SLURM_NNODES", 1)
        if not in_step and job_nodes > 1:
            raise RigError(
                f"running in the Slurm batch script of a {job_nodes}-node job, so only the first node "
                "runs rlrig; start it with `srun --ntasks-per-node=1 rlrig ...`"
            )
        per_node = _slurm_tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1")
        if in_step and per_node > 1:
            raise RigError(
                f"this Slurm step runs {per_node} tasks on a node but rlrig needs exactly one per node; "
                "use `srun --ntasks-per-node=1`"
            )
        nodelist = (env.get("SLURM_STEP_NODELIST") if in_step else None) or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        try:
            hosts = expand_hostlist(nodelist) if nodelist else []
        except HostlistError as e:
            raise RigError(f"SLURM_JOB_NODELIST: {e}") from None
        nnodes = (_int(env, "SLURM_STEP_NUM_NODES") if in_step else None) or job_nodes
        cpus = _int(env, "SLURM_CPUS_PER_TASK") or _int(env, "SLURM_CPUS_ON_NODE")
        return NodeSpec(
            launcher=cls.name,
            node_rank=_int(env, "SLURM_NODEID", 0),
            nnodes=nnodes,
            head_host=hosts[0] if hosts else hostname,
            gpus_allotted=_int(env, "SLURM_GPUS_ON_NODE"),
            cpus_allotted=cpus,
            job_id=env["SLURM_JOB_ID"] + (f".{env['SLURM_STEP_ID']}" if in_step else ""),
        )


class Mpi(Launcher):
    name = "mpi"

    @classmethod
    def detect(cls, env):
        return any(env.get(v) for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"))

    @classmethod
    def spec(cls, env, hostname):
        rank = _int(env, "OMPI_COMM_WORLD_RANK")
        if rank is None:
            rank = _int(env, "PMIX_RANK")
        if rank is None:
            rank = _int(env, "PMI_RANK", 0)
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") or _int(env, "MPI_LOCALNRANKS") or _int(env, "PMI_LOCAL_SIZE") or 1
        if local > 1:
            raise RigError(
                f"MPI started {local} ranks on this node but rlrig needs one per node; "
                "use `mpirun --map-by ppr:1:node` (Open MPI) or `-ppn 1` (Intel MPI)"
            )
        nnodes = _int(env, "OMPI_COMM_WORLD_SIZE") or _int(env, "PMI_SIZE") or _int(env, "PMIX_SIZE", 1)
        return NodeSpec(launcher=cls.name, node_rank=rank, nnodes=nnodes, head_host="")


class _HostFileLauncher(Launcher):
    """Batch systems that list one line per slot in a file: node rank = index among unique hosts."""

    file_var = ""

    @classmethod
    def hosts(cls, env) -> list[str]:
        path = env.get(cls.file_var, "")
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise RigError(f"{cls.file_var}={path} cannot be read ({e.strerror}); check the job's host file") from None
        return _unique(line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("#"))

    @classmethod
    def spec(cls, env, hostname):
        hosts = cls.hosts(env)
        if not hosts:
            raise RigError(f"{cls.file_var} lists no hosts")
        return NodeSpec(
            launcher=cls.name,
            node_rank=_host_index(hosts, hostname, cls.file_var),
            nnodes=len(hosts),
            head_host=hosts[0],
            job_id=env.get(cls.markers[0], ""),
        )


class Lsf(_HostFileLauncher):
    name = "lsf"
    markers = ("LSB_JOBID",)
    file_var = "LSB_DJOB_RANKFILE"

    @classmethod
    def hosts(cls, env):
        if env.get(cls.file_var):
            return super().hosts(env)
        words = env.get("LSB_MCPU_HOSTS", "").split()  # "hostA 2 hostB 1"
        return _unique(words[0::2])


class Pbs(_HostFileLauncher):
    name = "pbs"
    markers = ("PBS_JOBID", "PBS_NODEFILE")
    file_var = "PBS_NODEFILE"


class SageMaker(Launcher):
    name = "sagemaker"
    markers = ("SM_CURRENT_HOST", "SM_HOSTS")

    @classmethod
    def spec(cls, env, hostname):
        try:
            hosts = json.loads(env["SM_HOSTS"])
        except json.JSONDecodeError:
            raise RigError(f"SM_HOSTS={env['SM_HOSTS']!r} is not a JSON list of host names") from None
        current = env["SM_CURRENT_HOST"]
        if current not in hosts:
            raise RigError(f"SM_CURRENT_HOST={current} is not in SM_HOSTS={hosts}")
        return NodeSpec(
            launcher=cls.name,
            node_rank=hosts.index(current),
            nnodes=len(hosts),
            head_host=hosts[0],
            gpus_allotted=_int(env, "SM_NUM_GPUS"),
        )


class IndexedJob(Launcher):
    name = "indexed-job"
    markers = ("JOB_COMPLETION_INDEX",)

    @classmethod
    def spec(cls, env, hostname):
        # Kubernetes injects only the index: nodes and head come from RLRIG_NNODES/RLRIG_HEAD_ADDRESS.
        return NodeSpec(launcher=cls.name, node_rank=_int(env, "JOB_COMPLETION_INDEX", 0), nnodes=1, head_host="")


class Explicit(Launcher):
    """compose, plain `docker run`, bare metal: everything comes from RLRIG_* variables."""

    name = "explicit"
    markers = ("RLRIG_NODE_RANK",)

    @classmethod
    def detect(cls, env):
        return any(env.get(v) for v in ("RLRIG_NODE_RANK", "RLRIG_NNODES", "RLRIG_HEAD_ADDRESS"))

    @classmethod
    def spec(cls, env, hostname):
        return NodeSpec(launcher=cls.name, node_rank=0, nnodes=1, head_host="")


class Local(Launcher):
    name = "local"

    @classmethod
    def detect(cls, env):
        return True

    @classmethod
    def spec(cls, env, hostname):
        return NodeSpec(launcher=cls.name, node_rank=0, nnodes=1, head_host="127.0.0.1")


# Most specific first: torchrun also sets MASTER_ADDR/RANK, and Slurm may wrap any of the others.
LAUNCHERS: list[type[Launcher]] = [
    KubeRay, Dstack, SkyPilot, LeaderWorkerSet, TorchRun, PyTorchJob, Slurm, Lsf, Pbs, SageMaker, Mpi,
    IndexedJob, Explicit, Local,
]
BY_NAME = {cls.name: cls for cls in LAUNCHERS}


# RLRIG_* variable -> (NodeSpec field, is it an integer)
EXPLICIT = {
    "RLRIG_NODE_RANK": ("node_rank", True),
    "RLRIG_NNODES": ("nnodes", True),
    "RLRIG_HEAD_ADDRESS": ("head_host", False),
    "RLRIG_NODE_IP": ("node_ip_hint", False),
    "RLRIG_NUM_GPUS": ("gpus_allotted", True),
    "RLRIG_NUM_CPUS": ("cpus_allotted", True),
    "RLRIG_JOB_ID": ("job_id", False),
    "RLRIG_RAY_PORT": ("port", True),
}


def _apply_explicit(spec: NodeSpec, env: Mapping[str, str]) -> NodeSpec:
    """RLRIG_* variables win over whatever the launcher said."""
    for var, (attr, is_int) in EXPLICIT.items():
        value = _int(env, var) if is_int else (env.get(var) or "").strip() or None
        if value is not None:
            setattr(spec, attr, value)
    return spec


def _split_port(spec: NodeSpec) -> NodeSpec:
    """Accept `host:port`, `[v6]:port` and bare IPv6 in the head address."""
    host = spec.head_host
    m = re.fullmatch(r"\[([0-9A-Fa-f:.%\w]+)\](?::(\d+))?", host)
    if m:
        spec.head_host, port = m.group(1), m.group(2)
    elif host.count(":") == 1:
        spec.head_host, port = host.split(":")
    else:
        port = None  # a bare IPv6 address or a plain name
    if port:
        spec.port = int(port)
    return spec


def detect(env: Mapping[str, str] | None = None, launcher: str | None = None, hostname: str | None = None) -> NodeSpec:
    """Turn the launcher's environment into a NodeSpec; `launcher` forces one by name."""
    env = os.environ if env is None else env
    hostname = hostname or socket.gethostname()
    forced = launcher or env.get("RLRIG_LAUNCHER") or ""
    if forced:
        if forced not in BY_NAME:
            from difflib import get_close_matches

            near = get_close_matches(forced, BY_NAME, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise RigError(f"unknown launcher {forced!r}{hint}; choose one of: {', '.join(BY_NAME)}")
        cls = BY_NAME[forced]
    else:
        cls = next(c for c in LAUNCHERS if c.detect(env))
    spec = _split_port(_apply_explicit(cls.spec(env, hostname), env))
    if not spec.existing_ray and env.get("RAY_ADDRESS"):
        spec.existing_ray = env["RAY_ADDRESS"]  # also how a nested `rlrig train` under `rlrig run` behaves
    if spec.nnodes < 1:
        raise RigError(f"{spec.launcher}: number of nodes is {spec.nnodes}; set RLRIG_NNODES to a positive number")
    if not 0 <= spec.node_rank < spec.nnodes:
        raise RigError(
            f"{spec.launcher}: node rank {spec.node_rank} is outside 0..{spec.nnodes - 1}; "
            "check RLRIG_NODE_RANK / RLRIG_NNODES"
        )
    if not spec.head_host:
        if spec.nnodes == 1:
            spec.head_host = "127.0.0.1"
        else:
            raise RigError(f"{spec.launcher}: the head node's address is not known; set RLRIG_HEAD_ADDRESS=<head host or IP>")
    return spec
