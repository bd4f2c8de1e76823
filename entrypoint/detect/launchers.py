"""One small class per launcher: how to recognise it and what it tells this node.

Adding a launcher means adding a class here and a row to tests/unit/entrypoint/test_launchers.py.
Each class reads only the environment (and the files it names). `spec` reads what is there and
refuses only values it cannot parse; `check` refuses a way of starting rlrig that cannot work, after
the spec is known, so that `rlrig doctor` can still show what was read. Explicit RLRIG_* overrides,
range checks, address resolution and preflight happen later (detection.py, addresses.py, preflight/checks.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import RigError
from .hostlist import HostlistError, expand_hostlist
from .nodespec import NodeSpec


def int_var(env: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise RigError(f"{name}={raw!r} is not an integer; unset it or set a whole number") from None


def _need_int(env: Mapping[str, str], name: str) -> int:
    value = int_var(env, name)
    if value is None:
        raise RigError(
            f"{name} is set but blank; it should hold this node's rank: check how the launcher started rlrig"
        )
    return value


def _unique(seq) -> list[str]:
    return list(dict.fromkeys(seq))


def _host_index(hosts: list[str], hostname: str, source: str) -> int:
    candidates = {hostname, hostname.split(".")[0]}
    for i, h in enumerate(hosts):
        if h in candidates or h.split(".")[0] in candidates:
            return i
    raise RigError(
        f"this host ({hostname}) is not in {source} ({', '.join(hosts[:4])}...); set RLRIG_NODE_RANK for this node"
    )


class Launcher:
    """A way rlrig can be started on each node (Slurm, torchrun, dstack, ...): how to recognise it in the environment
    and what it says about this node. Every member is a class attribute or classmethod; nothing is instantiated.

    To add one: subclass, set the attributes, implement `spec` (and `check` where a way of starting cannot work),
    put the class in LAUNCHERS (most specific first: the first whose detect() claims the environment wins) and add a
    row to tests/unit/entrypoint/test_launchers.py. The CLI's --launcher choices and docs/reference/launchers.md
    come from LAUNCHERS.

    - `name`: what --launcher and RLRIG_LAUNCHER take, and NodeSpec.launcher.
    - `markers` / `any_markers`: the variables detect() looks for: every one of `markers` set (non-empty) and,
      when listed, at least one of `any_markers`. describe_markers() says them in an error.
    - `rank_vars`, `nnodes_vars`, `head_vars`: the variables `spec` reads for this node's rank, the node count and
      the head's address, in the order it prefers them; detection names the first one set when a value is wrong
      (unless `spec` records its own choice in NodeSpec.sources), and errors name them when none is.
    - detect(env) -> bool: whether this launcher started the process; reads `env` only.
    - spec(env, hostname) -> NodeSpec: what the launcher says (rank, node count, head host, GPUs and CPUs allotted,
      job id, this node's address hint); reads only `env` and the files it names, refuses only a value it cannot
      parse (RigError). RLRIG_* overrides, range checks and address resolution come later (detection.py).
    - check(env, spec) -> None: raises RigError when this launcher started rlrig in a way that cannot form a
      cluster (two ranks on one node, a batch script without srun); runs after `spec`, so that `rlrig doctor`
      still shows what was read.
    """

    name = ""
    markers: tuple[str, ...] = ()  # all of these must be set for detect() to claim the env
    any_markers: tuple[str, ...] = ()  # and, when listed, at least one of these
    # The variables this launcher reads for rank, node count and head, in the order `spec` prefers
    # them: the first one set is named as the source when a value is wrong (unless `spec` records
    # its own choice in NodeSpec.sources).
    rank_vars: tuple[str, ...] = ()
    nnodes_vars: tuple[str, ...] = ()
    head_vars: tuple[str, ...] = ()

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return all(env.get(m) for m in cls.markers) and (
            not cls.any_markers or any(env.get(m) for m in cls.any_markers)
        )

    @classmethod
    def describe_markers(cls) -> str:
        parts = list(cls.markers) + ([" or ".join(cls.any_markers)] if cls.any_markers else [])
        return " and ".join(parts) or "nothing"

    @classmethod
    def spec(cls, env: Mapping[str, str], hostname: str) -> NodeSpec:
        raise NotImplementedError

    @classmethod
    def check(cls, env: Mapping[str, str], spec: NodeSpec) -> None:
        """Raise RigError when this launcher started rlrig in a way that cannot form a cluster."""


class Dstack(Launcher):
    name = "dstack"
    markers = ("DSTACK_NODE_RANK",)
    rank_vars = ("DSTACK_NODE_RANK",)
    nnodes_vars = ("DSTACK_NODES_NUM",)
    head_vars = ("DSTACK_MASTER_NODE_IP", "DSTACK_NODES_IPS")

    @classmethod
    def spec(cls, env, hostname):
        rank = _need_int(env, "DSTACK_NODE_RANK")
        ips = [ip.strip() for ip in env.get("DSTACK_NODES_IPS", "").split("\n") if ip.strip()]
        return NodeSpec(
            launcher=cls.name,
            node_rank=rank,
            nnodes=int_var(env, "DSTACK_NODES_NUM", 1),
            head_host=env.get("DSTACK_MASTER_NODE_IP") or (ips[0] if ips else ""),
            gpus_allotted=int_var(env, "DSTACK_GPUS_PER_NODE"),
            job_id=env.get("DSTACK_RUN_NAME", ""),
            node_ip_hint=ips[rank] if 0 <= rank < len(ips) else "",
        )


class SkyPilot(Launcher):
    name = "skypilot"
    markers = ("SKYPILOT_NODE_RANK",)
    rank_vars = ("SKYPILOT_NODE_RANK",)
    nnodes_vars = ("SKYPILOT_NUM_NODES",)
    head_vars = ("SKYPILOT_NODE_IPS",)

    @classmethod
    def spec(cls, env, hostname):
        ips = [ip.strip() for ip in env.get("SKYPILOT_NODE_IPS", "").split("\n") if ip.strip()]
        rank = _need_int(env, "SKYPILOT_NODE_RANK")
        return NodeSpec(
            launcher=cls.name,
            node_rank=rank,
            nnodes=int_var(env, "SKYPILOT_NUM_NODES", 1),
            head_host=ips[0] if ips else "",
            gpus_allotted=int_var(env, "SKYPILOT_NUM_GPUS_PER_NODE"),
            job_id=env.get("SKYPILOT_TASK_ID", ""),
            # SkyPilot's own Ray holds 6380/8266/52365: ours takes free or job-derived ports (cluster/ports.py)
            node_ip_hint=ips[rank] if 0 <= rank < len(ips) else "",
        )


class KubeRay(Launcher):
    name = "kuberay"
    any_markers = ("KUBERAY_GEN_RAY_START_CMD", "RAY_CLUSTER_NAME")

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
    rank_vars = ("LWS_WORKER_INDEX",)
    nnodes_vars = ("LWS_GROUP_SIZE",)
    head_vars = ("LWS_LEADER_ADDRESS",)

    @classmethod
    def spec(cls, env, hostname):
        return NodeSpec(
            launcher=cls.name,
            node_rank=int_var(env, "LWS_WORKER_INDEX", 0),
            nnodes=int_var(env, "LWS_GROUP_SIZE", 1),
            head_host=env["LWS_LEADER_ADDRESS"],
        )


class TorchRun(Launcher):
    name = "torchrun"
    markers = ("TORCHELASTIC_RUN_ID",)
    rank_vars = ("GROUP_RANK",)
    nnodes_vars = ("WORLD_SIZE", "LOCAL_WORLD_SIZE")
    head_vars = ("MASTER_ADDR",)

    @classmethod
    def spec(cls, env, hostname):
        local = int_var(env, "LOCAL_WORLD_SIZE", 1)
        world = int_var(env, "WORLD_SIZE", 1)
        return NodeSpec(
            launcher=cls.name,
            node_rank=int_var(env, "GROUP_RANK", 0),
            nnodes=world // max(local, 1),
            head_host=env.get("MASTER_ADDR", ""),
            job_id=env.get("TORCHELASTIC_RUN_ID", ""),
        )

    @classmethod
    def check(cls, env, spec):
        local = int_var(env, "LOCAL_WORLD_SIZE", 1)
        if local != 1:
            raise RigError(
                f"torchrun started LOCAL_WORLD_SIZE={local} processes on this node but rlrig needs one "
                "per node; launch it with `torchrun --nproc-per-node=1 ...`"
            )


class PyTorchJob(Launcher):
    name = "pytorchjob"
    markers = ("MASTER_ADDR", "RANK")
    rank_vars = ("PET_NODE_RANK", "RANK")
    nnodes_vars = ("PET_NNODES", "WORLD_SIZE")
    head_vars = ("MASTER_ADDR",)

    @classmethod
    def spec(cls, env, hostname):
        rank = int_var(env, "PET_NODE_RANK")
        return NodeSpec(
            launcher=cls.name,
            node_rank=rank if rank is not None else _need_int(env, "RANK"),
            nnodes=int_var(env, "PET_NNODES") or int_var(env, "WORLD_SIZE", 1),
            head_host=env["MASTER_ADDR"],
            gpus_allotted=int_var(env, "PET_NPROC_PER_NODE")
            if (env.get("PET_NPROC_PER_NODE") or "").isdigit()
            else None,
        )


def _slurm_tasks_per_node(value: str) -> int:
    # SLURM_TASKS_PER_NODE looks like "1(x2),2": the largest count is what matters here.
    counts = [int(m.group(1)) for m in re.finditer(r"(\d+)(?:\(x\d+\))?", value)]
    return max(counts) if counts else 1


class Slurm(Launcher):
    name = "slurm"
    # A batch script of `sbatch -N2` has neither SLURM_NTASKS nor SLURM_STEP_ID (seen on slurm-wlm 22.05):
    # the job id alone must count, or rlrig would start a lone local cluster there.
    markers = ("SLURM_JOB_ID",)
    rank_vars = ("SLURM_NODEID",)
    nnodes_vars = ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    head_vars = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")

    @staticmethod
    def in_step(env) -> bool:
        return bool(env.get("SLURM_STEP_ID")) and env.get("SLURM_STEP_ID") != "batch"

    @staticmethod
    def job_nodes(env) -> int:
        return int_var(env, "SLURM_JOB_NUM_NODES") or int_var(env, "SLURM_NNODES", 1)

    @classmethod
    def spec(cls, env, hostname):
        in_step = cls.in_step(env)
        names = (["SLURM_STEP_NODELIST"] if in_step else []) + ["SLURM_JOB_NODELIST", "SLURM_NODELIST"]
        var = next((n for n in names if env.get(n)), "")
        try:
            hosts = expand_hostlist(env[var]) if var else []
        except HostlistError as e:
            raise RigError(f"{var}: {e}") from None
        step_nodes = int_var(env, "SLURM_STEP_NUM_NODES") if in_step else None
        nnodes_var = (
            "SLURM_STEP_NUM_NODES"
            if step_nodes
            else next((n for n in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES") if int_var(env, n)), "")
        )
        cpus = int_var(env, "SLURM_CPUS_PER_TASK") or int_var(env, "SLURM_CPUS_ON_NODE")
        return NodeSpec(
            launcher=cls.name,
            node_rank=int_var(env, "SLURM_NODEID", 0),
            nnodes=step_nodes or cls.job_nodes(env),
            head_host=hosts[0] if hosts else hostname,
            gpus_allotted=int_var(env, "SLURM_GPUS_ON_NODE"),
            cpus_allotted=cpus,
            job_id=env["SLURM_JOB_ID"] + (f".{env['SLURM_STEP_ID']}" if in_step else ""),
            node_name=env.get("SLURMD_NODENAME", ""),  # what srun --exclude takes (cluster/node_failures.py)
            # which of the candidates was read depends on being in a step: say it here, not by declaration order
            sources={"nnodes": nnodes_var, "head_host": var},
        )

    @classmethod
    def check(cls, env, spec):
        in_step, job_nodes = cls.in_step(env), cls.job_nodes(env)
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


class Mpi(Launcher):
    name = "mpi"
    any_markers = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK")
    rank_vars = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK")
    nnodes_vars = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE")

    @classmethod
    def spec(cls, env, hostname):
        rank = int_var(env, "OMPI_COMM_WORLD_RANK")
        if rank is None:
            rank = int_var(env, "PMIX_RANK")
        if rank is None:
            rank = int_var(env, "PMI_RANK", 0)
        nnodes = int_var(env, "OMPI_COMM_WORLD_SIZE") or int_var(env, "PMI_SIZE") or int_var(env, "PMIX_SIZE", 1)
        return NodeSpec(launcher=cls.name, node_rank=rank, nnodes=nnodes, head_host="")

    @classmethod
    def check(cls, env, spec):
        local = (
            int_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
            or int_var(env, "MPI_LOCALNRANKS")
            or int_var(env, "PMI_LOCAL_SIZE")
            or 1
        )
        if local > 1:
            raise RigError(
                f"MPI started {local} ranks on this node but rlrig needs one per node; "
                "use `mpirun --map-by ppr:1:node` (Open MPI) or `-ppn 1` (Intel MPI)"
            )


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
    def host_var(cls, env) -> str:
        return cls.file_var

    @classmethod
    def spec(cls, env, hostname):
        hosts = cls.hosts(env)
        if not hosts:
            raise RigError(f"{cls.host_var(env)} lists no hosts")
        return NodeSpec(
            launcher=cls.name,
            # An explicit RLRIG_NODE_RANK replaces the rank later, so a host missing from the list is no error then.
            node_rank=-1
            if (env.get("RLRIG_NODE_RANK") or "").strip()
            else _host_index(hosts, hostname, cls.host_var(env)),
            nnodes=len(hosts),
            head_host=hosts[0],
            job_id=env.get(cls.markers[0], ""),
        )


class Lsf(_HostFileLauncher):
    name = "lsf"
    markers = ("LSB_JOBID",)
    file_var = "LSB_DJOB_RANKFILE"
    rank_vars = nnodes_vars = head_vars = ("LSB_DJOB_RANKFILE", "LSB_MCPU_HOSTS")

    @classmethod
    def host_var(cls, env):
        return cls.file_var if env.get(cls.file_var) else "LSB_MCPU_HOSTS"

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
    rank_vars = nnodes_vars = head_vars = ("PBS_NODEFILE",)


class SageMaker(Launcher):
    name = "sagemaker"
    markers = ("SM_CURRENT_HOST", "SM_HOSTS")
    rank_vars = ("SM_CURRENT_HOST",)
    nnodes_vars = head_vars = ("SM_HOSTS",)

    @classmethod
    def spec(cls, env, hostname):
        try:
            hosts = json.loads(env["SM_HOSTS"])
        except json.JSONDecodeError:
            hosts = None
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise RigError(f"SM_HOSTS={env['SM_HOSTS']!r} is not a JSON list of host names")
        current = env["SM_CURRENT_HOST"]
        if current not in hosts:
            raise RigError(f"SM_CURRENT_HOST={current} is not in SM_HOSTS={hosts}")
        return NodeSpec(
            launcher=cls.name,
            node_rank=hosts.index(current),
            nnodes=len(hosts),
            head_host=hosts[0],
            gpus_allotted=int_var(env, "SM_NUM_GPUS"),
        )


class IndexedJob(Launcher):
    name = "indexed-job"
    markers = ("JOB_COMPLETION_INDEX",)
    rank_vars = ("JOB_COMPLETION_INDEX",)

    @classmethod
    def spec(cls, env, hostname):
        # Kubernetes injects only the index: nodes and head come from RLRIG_NNODES/RLRIG_HEAD_ADDRESS.
        return NodeSpec(launcher=cls.name, node_rank=int_var(env, "JOB_COMPLETION_INDEX", 0), nnodes=1, head_host="")


class Explicit(Launcher):
    """compose, plain `docker run`, bare metal: everything comes from RLRIG_* variables."""

    name = "explicit"
    any_markers = ("RLRIG_NODE_RANK", "RLRIG_NNODES", "RLRIG_HEAD_ADDRESS")
    rank_vars = ("RLRIG_NODE_RANK",)
    nnodes_vars = ("RLRIG_NNODES",)
    head_vars = ("RLRIG_HEAD_ADDRESS",)

    @classmethod
    def spec(cls, env, hostname):
        return NodeSpec(launcher=cls.name, node_rank=0, nnodes=1, head_host="")


class Local(Launcher):
    name = "local"  # no markers: claims any environment, so it comes last

    @classmethod
    def spec(cls, env, hostname):
        return NodeSpec(launcher=cls.name, node_rank=0, nnodes=1, head_host="127.0.0.1")


# Most specific first: torchrun also sets MASTER_ADDR/RANK, and Slurm may wrap any of the others.
LAUNCHERS: list[type[Launcher]] = [
    KubeRay,
    Dstack,
    SkyPilot,
    LeaderWorkerSet,
    TorchRun,
    PyTorchJob,
    Slurm,
    Lsf,
    Pbs,
    SageMaker,
    Mpi,
    IndexedJob,
    Explicit,
    Local,
]
BY_NAME = {cls.name: cls for cls in LAUNCHERS}
