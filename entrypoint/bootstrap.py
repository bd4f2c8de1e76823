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

from .cluster import auth, debugmode, identity, ports, prestart, raystart, runs
from .console import say
from .detect import addresses, clusterenv, detection
from .detect.nodespec import NodeSpec
from .errors import RigError
from .plan import Plan
from .preflight import checks, inventory, rayversion, resources
from .preflight.checks import FAIL, PASS, Preflight


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
    checks.run(spec, env, inv, found.temp_dir, pf)
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


@dataclass(frozen=True)
class PlanOptions:
    """What the command line asks of this node's plan (cli.make_plan builds it from run, train or up's options)."""

    command: list[str]  # empty for a standing cluster (`rlrig up`)
    launcher: str | None = None  # --launcher: forced by name instead of detected
    temp_override: str | None = None  # --temp-dir
    env_file: str | None = None  # --env-file (default ./.env when present)
    dashboard_host: str = "127.0.0.1"
    wait_timeout: float | None = None  # --timeout; None: RLRIG_WAIT_TIMEOUT, else 300 s
    standing: bool = False  # `rlrig up`: no command, serve submitted jobs
    debug: str | None = None  # --debug: post-mortem or legacy
    metrics_on_node_ip: bool = False
    grace_period: float = 120.0
    fabric_check: bool = False  # the head checks the network before the command (multi-node only; fabric/driver.py)
    fabric_min_ratio: float = 0.5
    max_restarts: int = 0
    rejoin_timeout: float = 300.0
    output: str = ""  # where the command writes (the trainer's default_local_dir): recorded with the run


def reserve_ports(spec: NodeSpec, o: PlanOptions, env: Mapping[str, str], pf: Preflight) -> tuple[dict, runs.Record]:
    """This run's identity, and this node's ports chosen (cluster/ports.py) and recorded in the host's runs folder
    (cluster/runs.py) in one step, so that no other rlrig run here picks them; spec.port becomes the GCS's."""
    key = ports.identity_key(spec.launcher, spec.job_id, spec.head_host)
    run = identity.make(spec.launcher, spec.job_id, key, spec.nnodes, o.output)

    def choose(taken: set[int]) -> dict[str, int]:
        gcs = spec.port if spec.port_given else None
        return ports.choose(
            is_head=spec.is_head, nnodes=spec.nnodes, standing=o.standing, key=key, gcs_port=gcs, taken=taken
        )

    fields = {
        "run": run["id"],
        "launcher": spec.launcher,
        "job": spec.job_id,
        "rank": spec.node_rank,
        "nnodes": spec.nnodes,
        "host": spec.node_ip,
        "gpus": f"{runs.visible_gpus(env)} ({pf.num_gpus})",
        "output": o.output,
        "standing": o.standing,
    }
    record = runs.reserve(runs.runs_dir(env), choose, fields)
    spec.port = record.fields["ports"]["gcs"]
    return run, record


def plan(options: PlanOptions, env: Mapping[str, str] | None = None) -> Plan:
    """This node's Plan from `options` and the environment (the process's unless given); raises the first failed
    stage's RigError (the other failures said on stderr) before anything starts. Reserves this node's ports on the
    host (reserve_ports): the record it writes is removed by lifecycle.main, or by whoever finds this process gone."""
    o = options
    env = dict(os.environ if env is None else env)
    wait_timeout = wait_timeout_from_env(env) if o.wait_timeout is None else o.wait_timeout
    found = inspect(env, o.launcher, o.temp_override, keep_going=False, env_file=o.env_file)
    pf = found.preflight
    refuse_failures(pf)
    spec = found.spec
    if spec.existing_ray:
        if o.standing:
            raise RigError(
                f"Ray already runs here (RAY_ADDRESS={spec.existing_ray}): there is nothing to bring up; "
                "submit to that cluster with `rlrig submit`, or unset RAY_ADDRESS"
            )
        return Plan(spec=spec, command=o.command, base_env=env, grace_period=o.grace_period)
    token, source = auth.resolve_token(env, spec.nnodes, shared=o.standing)
    node_debug = debugmode.debug_env(o.debug)
    # the head sends its --debug with the cluster environment, so every node starts Ray with it
    cluster = (
        {**clusterenv.cluster_env(env, o.env_file or clusterenv.default_env_file()), **node_debug}
        if spec.is_head
        else {}
    )
    metrics_host = spec.node_ip if o.metrics_on_node_ip else "127.0.0.1"
    run, record = reserve_ports(spec, o, env, pf)
    node_ports = record.fields["ports"]
    ray_env = raystart.start_env(
        env, cluster, pf, auth.ray_auth_env(token), found.temp_dir, node_debug, metrics_host, node_ports
    )
    debugmode.check(ray_env)
    return Plan(
        spec=spec,
        command=o.command,
        base_env=env,
        preflight=pf,
        temp_dir=found.temp_dir,
        token=token,
        token_source=source,
        cluster_env=cluster,
        ray_env=ray_env,
        start_command=raystart.start_command(
            spec, pf, found.temp_dir, o.dashboard_host, debugmode.debugger_external(ray_env), node_ports
        ),
        wait_timeout=wait_timeout,
        grace_period=o.grace_period,
        max_restarts=o.max_restarts,
        rejoin_timeout=o.rejoin_timeout,
        fabric_check=o.fabric_check,
        fabric_min_ratio=o.fabric_min_ratio,
        standing=o.standing,
        debug_env=node_debug,
        metrics_host=metrics_host,
        dashboard_url=dashboard_url(o.dashboard_host, node_ports.get("dashboard", 8265)),
        ports=node_ports,
        run=run,
        record=record,
    )


def refuse_failures(pf: Preflight) -> None:
    """Say every check that did not pass, and raise the first failure (naming how many more `rlrig doctor` shows)."""
    failed = pf.failed
    for c in pf.checks:
        if c.status != PASS and not (failed and c is failed[0]):  # the first failure is the error itself
            say(f"{c.status}: {c.name}: {c.message}")
    if failed:
        more = f" (and {len(failed) - 1} more: run `rlrig doctor`)" if len(failed) > 1 else ""
        raise RigError(failed[0].message + more)
