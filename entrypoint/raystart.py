"""The `ray start` command line and environment for this node, computed from spec + preflight."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Mapping

from .addresses import format_hostport
from .coordination import RANK_LABEL
from .nodespec import NodeSpec
from .preflight import Preflight

# Faster dead-node detection than Ray's defaults (~15-25 s), so a lost worker stops the job in
# seconds instead of leaving NCCL to time out. Users may override any of them in the environment.
HEALTH_DEFAULTS = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "5",
}


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


def start_command(spec: NodeSpec, pf: Preflight, temp: str, dashboard_host: str) -> list[str]:
    cmd = [ray_executable(), "start", "--block", "--disable-usage-stats",
           f"--node-ip-address={spec.node_ip}", f"--num-cpus={pf.num_cpus}", f"--num-gpus={pf.num_gpus}",
           f"--temp-dir={temp}", f"--labels={json.dumps({RANK_LABEL: str(spec.node_rank)})}"]
    if pf.object_store_bytes:
        cmd.append(f"--object-store-memory={pf.object_store_bytes}")
    if spec.is_head:
        cmd += ["--head", f"--port={spec.port}", f"--dashboard-host={dashboard_host}"]
    else:
        cmd.append(f"--address={format_hostport(spec.head_address, spec.port)}")
    return cmd + spec.ray_start_args


def start_env(base: Mapping[str, str], cluster: Mapping[str, str], pf: Preflight, auth: Mapping[str, str], temp: str) -> dict[str, str]:
    env = {**HEALTH_DEFAULTS, **base, **cluster, **pf.env_updates, **auth}
    env["RAY_TMPDIR"] = temp
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.pop("RAY_ADDRESS", None)
    return env
