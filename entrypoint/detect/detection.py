"""From the process environment to a NodeSpec: pick the launcher, read it, let RLRIG_* win, validate.

Split in stages so that `rlrig doctor` can show what was read even when a later stage refuses it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from difflib import get_close_matches

from ..errors import RigError
from .launchers import BY_NAME, LAUNCHERS, Launcher, int_var
from .nodespec import NodeSpec

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
# NodeSpec field -> the Launcher attribute declaring the variables it is read from
DECLARED = {"node_rank": "rank_vars", "nnodes": "nnodes_vars", "head_host": "head_vars"}
OVERRIDE = {field: var for var, (field, _) in EXPLICIT.items() if field in DECLARED}
WHAT = {"node_rank": "this node's rank", "nnodes": "the number of nodes", "head_host": "the head's address"}


def choose(env: Mapping[str, str], launcher: str | None = None) -> type[Launcher]:
    """The launcher forced by name (--launcher, RLRIG_LAUNCHER), else the first that claims the env."""
    forced = launcher or env.get("RLRIG_LAUNCHER") or ""
    if not forced:
        return next(c for c in LAUNCHERS if c.detect(env))
    if forced not in BY_NAME:
        near = get_close_matches(forced, BY_NAME, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise RigError(f"unknown launcher {forced!r}{hint}; choose one of: {', '.join(BY_NAME)}")
    cls = BY_NAME[forced]
    if not cls.detect(env):
        how = "--launcher" if launcher else "RLRIG_LAUNCHER"
        raise RigError(
            f"{how} {forced}: this environment has no {cls.describe_markers()}; "
            "pick the launcher that started rlrig or drop the option"
        )
    return cls


def read(cls: type[Launcher], env: Mapping[str, str], hostname: str | None = None) -> NodeSpec:
    """What the launcher says, with RLRIG_* overrides applied. Raises only on values it cannot parse."""
    spec = cls.spec(env, hostname or socket.gethostname())
    spec.sources = {
        field: spec.sources.get(field) or next((v for v in getattr(cls, attr) if (env.get(v) or "").strip()), "")
        for field, attr in DECLARED.items()
    }
    _apply_explicit(spec, env)
    _split_port(spec)
    if not spec.existing_ray and env.get("RAY_ADDRESS"):
        spec.existing_ray = env["RAY_ADDRESS"]  # also how a nested `rlrig train` under `rlrig run` behaves
    return spec


def validate(cls: type[Launcher], spec: NodeSpec, env: Mapping[str, str]) -> NodeSpec:
    """Refuse a spec that cannot form a cluster, naming the variables that produced it."""
    cls.check(env, spec)
    if spec.nnodes < 1:
        raise RigError(f"{spec.launcher}: number of nodes is {spec.nnodes}; check {origin(cls, spec, env, 'nnodes')}")
    if not 0 < spec.port < 65536:
        raise RigError(
            f"{spec.launcher}: Ray port {spec.port} is not a TCP port; set RLRIG_RAY_PORT "
            "(or the head address's :port) to a number in 1..65535"
        )
    if not 0 <= spec.node_rank < spec.nnodes:
        raise RigError(
            f"{spec.launcher}: node rank {spec.node_rank} is outside 0..{spec.nnodes - 1}; "
            f"check {origin(cls, spec, env, 'node_rank')} and {origin(cls, spec, env, 'nnodes')}"
        )
    if not spec.head_host:
        if spec.nnodes > 1:
            why = f"{' and '.join(cls.head_vars)} unset" if cls.head_vars else f"{spec.launcher} does not give it"
            raise RigError(
                f"{spec.launcher}: the head node's address is not known ({why}); "
                f"set {OVERRIDE['head_host']}=<head host or IP>"
            )
        spec.head_host = "127.0.0.1"
    return spec


def origin(cls: type[Launcher], spec: NodeSpec, env: Mapping[str, str], field: str) -> str:
    """`VAR=value` for the variable that gave `field`, or which variable to set when none did."""
    var = spec.sources.get(field, "")
    if var:
        return f"{var}={env.get(var, '').strip()}"
    declared = getattr(cls, DECLARED[field])
    if declared:
        return f"{declared[0]} (unset)"
    return f"{OVERRIDE[field]} (unset; {spec.launcher} does not give {WHAT[field]})"


def detect(env: Mapping[str, str] | None = None, launcher: str | None = None, hostname: str | None = None) -> NodeSpec:
    """Turn the launcher's environment into a validated NodeSpec; `launcher` forces one by name."""
    env = os.environ if env is None else env
    cls = choose(env, launcher)
    return validate(cls, read(cls, env, hostname), env)


def _apply_explicit(spec: NodeSpec, env: Mapping[str, str]) -> None:
    """RLRIG_* variables win over whatever the launcher said."""
    for var, (attr, is_int) in EXPLICIT.items():
        value = int_var(env, var) if is_int else (env.get(var) or "").strip() or None
        if value is not None:
            setattr(spec, attr, value)
            spec.port_given = spec.port_given or attr == "port"
            if attr in DECLARED:
                spec.sources[attr] = var


def _split_port(spec: NodeSpec) -> None:
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
        if not port.isdigit():
            raise RigError(
                f"head address {host!r} ({spec.sources.get('head_host') or 'head'}) has a port that is not a number; "
                "use host:port or [v6]:port"
            )
        spec.port = int(port)
        spec.port_given = True
