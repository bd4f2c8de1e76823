"""The `ray start` command line and environment for this node, computed from spec + preflight."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from ..detect.addresses import format_hostport
from ..detect.nodespec import NodeSpec
from ..preflight.checks import Preflight
from . import metricsbind, ports
from .coordination import GPU_MODEL_LABEL, HOST_LABEL, LAUNCHER_LABEL, NNODES_LABEL, NO_GPU, RANK_LABEL

# Faster dead-node detection than Ray's defaults (~15-25 s), so a lost worker stops the job in
# seconds instead of leaving NCCL to time out. Users may override any of them in the environment.
HEALTH_DEFAULTS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "5",
}
# On SIGTERM, Ray 2.60's `ray start` first asks the head's GCS to drain its node (made for Ray Serve's proxies on a
# pod's deletion). rlrig stops a node's Ray when the job is over, as the head stops its GCS: a drain request that
# meets the GCS shutting down prints a traceback (RpcError: Cancelling all calls), one that finds it gone waits
# until killed. Nothing here needs a drain: each node stops at once. A user who sets the variable keeps theirs.
SHUTDOWN_DEFAULTS = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


def ray_executable() -> str:
    """The `ray` next to this interpreter, so every node runs the Ray it validated."""
    local = Path(sys.executable).with_name("ray")
    return str(local) if local.exists() else (shutil.which("ray") or "ray")


def temp_dir(spec: NodeSpec, env: Mapping[str, str], override: str | None) -> str:
    """Per job and per node: nodes that share /tmp (Apptainer, namespaces) must not share /tmp/ray.

    Kept short: Ray puts Unix sockets below it and socket paths are limited to 107 bytes.
    """
    if override:
        return override
    base = env.get("RAY_TMPDIR") or "/tmp"
    job = (spec.job_id or f"p{os.getpid()}").replace("/", "_")[:16]
    return str(Path(base) / f"rlrig-{os.getuid()}" / f"{job}-n{spec.node_rank}")


def label_value(text: str) -> str:
    """Ray accepts label values of at most 63 letters, digits, `-`, `_`, `.`, starting and ending alphanumeric."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.") or "unknown"


def node_labels(spec: NodeSpec, pf: Preflight) -> dict[str, str]:
    """The Ray labels this node starts with: what placement selects nodes by (the trainer pins by rank;
    jobs may pick a GPU model) and the names `rlrig status` shows."""
    # the node count as a label too, so that a client that sees only the dashboard (rlrig submit) knows
    # when every node has joined
    return {
        RANK_LABEL: str(spec.node_rank),
        NNODES_LABEL: str(spec.nnodes),
        HOST_LABEL: label_value(socket.gethostname()),
        GPU_MODEL_LABEL: label_value(pf.gpu_model) if pf.num_gpus else NO_GPU,
        LAUNCHER_LABEL: label_value(spec.launcher),
    }


def start_command(
    spec: NodeSpec,
    pf: Preflight,
    temp: str,
    dashboard_host: str,
    debugger_external: bool = False,
    port_map: Mapping[str, int] | None = None,
) -> list[str]:
    """`port_map`: every port this node's Ray takes but the GCS's (cluster/ports.py); spec.port is the GCS's."""
    cmd = [
        ray_executable(),
        "start",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={spec.node_ip}",
        f"--num-cpus={pf.num_cpus}",
        f"--num-gpus={pf.num_gpus}",
        f"--temp-dir={temp}",
        f"--labels={json.dumps(node_labels(spec, pf))}",
    ]
    if pf.custom_resources:
        cmd.append(f"--resources={json.dumps(pf.custom_resources)}")
    if pf.object_store_bytes:
        cmd.append(f"--object-store-memory={pf.object_store_bytes}")
    if spec.is_head:
        cmd += ["--head", f"--port={spec.port}", f"--dashboard-host={dashboard_host}"]
    else:
        cmd.append(f"--address={format_hostport(spec.head_address, spec.port)}")
    cmd += ports.start_flags(port_map or {})
    if debugger_external:
        cmd.append("--ray-debugger-external")
    return cmd + spec.ray_start_args


def hook_dir(temp: str) -> str:
    return str(Path(temp) / "pyhook")


def start_env(
    base: Mapping[str, str],
    cluster: Mapping[str, str],
    pf: Preflight,
    auth: Mapping[str, str],
    temp: str,
    node: Mapping[str, str] | None = None,
    metrics_host: str = "127.0.0.1",
    port_map: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """`node`: this node's own additions (--debug), over the cluster's; `port_map`: the ports Ray reads from the
    environment (cluster/ports.py), which no layer below replaces."""
    env = {**HEALTH_DEFAULTS, **SHUTDOWN_DEFAULTS, **base, **cluster, **(node or {}), **pf.env_updates, **auth}
    env.update(ports.start_env(port_map or {}))
    env["RAY_TMPDIR"] = temp
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.pop("RAY_ADDRESS", None)
    # `rlrig`, `python3` and `ray` in jobs and workers are the ones next to this interpreter, the install
    # that was validated here (a submitted `rlrig train` included)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH", "")) if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (hook_dir(temp), env.get("PYTHONPATH", "")) if p)
    env[metricsbind.HOST_VAR] = metrics_host
    return env
