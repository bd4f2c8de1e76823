"""From the process environment to what this node will do.

`inspect` runs the stages (the installed Ray, launcher, addresses, inventory, preflight) and records a failed stage as
a failed check; for `rlrig doctor` it goes on with every stage that does not need the failed one's
result, so the report holds all that could be found out. `plan` stops at the first failed stage,
refuses any failure, and returns the Plan that lifecycle carries out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from . import (
    addresses,
    auth,
    clusterenv,
    debugmode,
    detection,
    inventory,
    preflight,
    prestart,
    raystart,
    rayversion,
    resources,
)
from .console import say
from .errors import RigError
from .nodespec import NodeSpec
from .plan import Plan
from .preflight import FAIL, PASS, Preflight


@dataclass
class Inspection:
    launcher: str | None = None  # the launcher chosen, or the name forced when choosing failed
    spec: NodeSpec | None = None  # None when the launcher's variables could not be read at all
    preflight: Preflight = field(default_factory=Preflight)  # detection failures come first
    temp_dir: str = ""
    checked: bool = False  # the machine was inspected (there was a spec and no existing Ray)
    before_ray: dict[str, str] = field(default_factory=dict)  # what `ray start` would get that only counts there


def inspect(
    env: Mapping[str, str],
    launcher: str | None = None,
    temp_override: str | None = None,
    hostname: str | None = None,
    collect: Callable[..., inventory.Inventory] | None = None,
    keep_going: bool = True,
    env_file: str | None = None,
) -> Inspection:
    """`collect` reads the machine (inventory.collect unless given: tests pass a made-up one).
    `keep_going=False` stops after a failed Ray version, detection or address stage. `env_file`: this node's .env
    (default ./.env when present), read here for RLRIG_RESOURCES on every node."""
    found = Inspection(launcher=launcher or env.get("RLRIG_LAUNCHER") or None)
    pf = found.preflight
    rayversion.check(rayversion.installed(), pf)  # first: without token authentication nothing else matters
    detected = False
    try:
        cls = detection.choose(env, launcher)
        found.launcher = cls.name
        found.spec = detection.read(cls, env, hostname)
        detection.validate(cls, found.spec, env)
        detected = True
    except RigError as e:
        pf.add("launcher", FAIL, str(e))
    spec = found.spec
    if spec is None or not spec.existing_ray:  # beside a Ray that is already there rlrig starts none
        resources.check(env, env_file or clusterenv.default_env_file(), pf)
    if spec is None or spec.existing_ray or (pf.failed and not keep_going):
        return found
    found.temp_dir = raystart.temp_dir(spec, env, temp_override)
    inv = (collect or inventory.collect)(found.temp_dir, env)
    if detected:  # a spec that failed validation has no head to resolve
        try:
            addresses.resolve_spec(spec, inv.interfaces)
        except RigError as e:
            pf.add("head address", FAIL, str(e))
            if not keep_going:
                return found
    preflight.run(spec, env, inv, found.temp_dir, pf)
    found.checked = True
    # the head's own .env and RLRIG_ENV_* (a worker gets the head's when it joins)
    cluster = clusterenv.cluster_env(env, clusterenv.default_env_file() if spec.is_head else None)
    ray_env = raystart.start_env(env, cluster, pf, {"RAY_AUTH_MODE": "token"}, found.temp_dir)
    found.before_ray = prestart.select(ray_env, cluster)
    return found


def wait_timeout_from_env(env: Mapping[str, str]) -> float:
    raw = env.get("RLRIG_WAIT_TIMEOUT", "").strip() or "300"
    try:
        return float(raw)
    except ValueError:
        raise RigError(f"RLRIG_WAIT_TIMEOUT={raw!r} is not a number of seconds; unset it or set e.g. 600") from None


def dashboard_url(host: str, port: int = 8265) -> str:
    """How the head reaches its own dashboard: a wildcard listens on loopback too."""
    local = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{local}]:{port}" if ":" in local else f"http://{local}:{port}"


def plan(
    command: list[str],
    env: Mapping[str, str] | None = None,
    launcher: str | None = None,
    temp_override: str | None = None,
    env_file: str | None = None,
    dashboard_host: str = "127.0.0.1",
    wait_timeout: float | None = None,
    standing: bool = False,
    debug: str | None = None,
    metrics_on_node_ip: bool = False,
    grace_period: float = 120.0,
    fabric_check: bool = False,
    fabric_min_ratio: float = 0.5,
    max_restarts: int = 0,
    rejoin_timeout: float = 300.0,
) -> Plan:
    """`wait_timeout` None: RLRIG_WAIT_TIMEOUT, else 300 s. `standing`: `rlrig up` (no command).
    `fabric_check`: the head checks the network before the command (multi-node only; see fabric.py)."""
    env = dict(os.environ if env is None else env)
    if wait_timeout is None:
        wait_timeout = wait_timeout_from_env(env)
    found = inspect(env, launcher, temp_override, keep_going=False, env_file=env_file)
    pf = found.preflight
    failed = pf.failed
    for c in pf.checks:
        if c.status != PASS and not (failed and c is failed[0]):  # the first failure is the error itself
            say(f"{c.status}: {c.name}: {c.message}")
    if failed:
        more = f" (and {len(failed) - 1} more: run `rlrig doctor`)" if len(failed) > 1 else ""
        raise RigError(failed[0].message + more)
    spec = found.spec
    if spec.existing_ray:
        if standing:
            raise RigError(
                f"Ray already runs here (RAY_ADDRESS={spec.existing_ray}): there is nothing to bring up; "
                "submit to that cluster with `rlrig submit`, or unset RAY_ADDRESS"
            )
        return Plan(spec=spec, command=command, base_env=env)
    token, source = auth.resolve_token(env, spec.nnodes, shared=standing)
    node_debug = debugmode.debug_env(debug)
    # the head sends its --debug with the cluster environment, so every node starts Ray with it
    cluster = (
        {**clusterenv.cluster_env(env, env_file or clusterenv.default_env_file()), **node_debug} if spec.is_head else {}
    )
    metrics_host = spec.node_ip if metrics_on_node_ip else "127.0.0.1"
    ray_env = raystart.start_env(env, cluster, pf, auth.ray_auth_env(token), found.temp_dir, node_debug, metrics_host)
    debugmode.check(ray_env)
    return Plan(
        spec=spec,
        command=command,
        base_env=env,
        preflight=pf,
        temp_dir=found.temp_dir,
        token=token,
        token_source=source,
        cluster_env=cluster,
        ray_env=ray_env,
        start_command=raystart.start_command(
            spec, pf, found.temp_dir, dashboard_host, debugmode.debugger_external(ray_env)
        ),
        wait_timeout=wait_timeout,
        grace_period=grace_period,
        max_restarts=max_restarts,
        rejoin_timeout=rejoin_timeout,
        fabric_check=fabric_check,
        fabric_min_ratio=fabric_min_ratio,
        standing=standing,
        debug_env=node_debug,
        metrics_host=metrics_host,
        dashboard_url=dashboard_url(dashboard_host),
    )
