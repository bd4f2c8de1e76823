"""Carries out a Plan: start / wait / run / stop, on every node. Linear on purpose: read it top to bottom.

Head:   ray start --head -> publish env (several nodes, run/train: and where its fabric probe listens) -> (a GPU
        head: start the fabric check over Ray, fabric.py) -> wait for nnodes -> compare versions -> the fabric
        check's verdict (a head without a GPU: measured from here, fabric_tcp.py) -> run CMD while
        watching nodes (`rlrig up`: serve submitted jobs, standing.py) -> publish exit code -> stop.
Worker: wait for the head's GCS -> read env -> (several nodes: its fabric probe) -> ray start --address -> wait for
        the head's exit code (or notice the head is gone) -> stop.
What is said to whom through the head's store is coordination.py; this module owns the processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from . import coordination, fabric, fabric_tcp, metricsbind, prestart, raystart, resources, standing
from .console import say
from .errors import HANG_EXIT, FabricFailed, NodeLost, RigError
from .gcs import GcsStore
from .jobs import JobApi
from .node_failures import EXCLUDE_FILE_ENV, NodeFailures
from .plan import Plan
from .processes import Stop, become_subreaper, install_stop_handlers, pass_on, sweep_descendants, terminate_group

POLL = 0.2
FABRIC_REPORT_ENV = (
    "RLRIG_FABRIC_REPORT"  # the command learns where the fabric check's report is (the trainer copies it)
)
RESTARTS_ENV = "RLRIG_RESTARTS"  # how many times the command was restarted in place (the trainer logs it)
SETTLE = 15.0  # Ray declares a killed node dead within ~7 s (raystart's health-check settings); a margin on top
FABRIC_TIMEOUT = 60.0  # the fabric check's own budget is 50 s; past this it is killed and the job stops


def _ray_died(proc: subprocess.Popen, what: str) -> RigError:
    return RigError(f"{what}: `ray start` exited with code {proc.returncode}; see its output above")


def _head_ray_alive(proc: subprocess.Popen) -> Callable[[], None]:
    def check() -> None:
        if proc.poll() is not None:
            raise _ray_died(proc, "head")

    return check


def run_command(
    cmd: list[str],
    env: Mapping[str, str],
    store: coordination.Store,
    ray_proc: subprocess.Popen,
    grace: float = 0.0,
    settle: float = 0.0,
) -> int:
    """Run CMD; stop it if a node dies. Returns CMD's exit code. A stop signal is passed on to CMD, which gets
    `grace` seconds to finish with the cluster still up. `settle` > 0 (restarts left): a failed CMD is first
    checked for a node lost up to `settle` seconds after it, since the command may see a peer die (a collective
    breaks) before Ray declares that node dead."""
    before = coordination.members(store)
    child = subprocess.Popen(cmd, env=dict(env), start_new_session=True)
    try:
        next_check = time.monotonic() + 1.0
        while child.poll() is None:
            time.sleep(POLL)
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + 1.0
            _check_members(store, ray_proc, before)
        if child.returncode != 0 and settle > 0:
            end = time.monotonic() + settle
            while time.monotonic() < end:
                _check_members(store, ray_proc, before)
                time.sleep(POLL)
        return child.returncode
    except Stop as s:
        if grace > 0:
            say(f"{s}: passed to the command; up to {grace:g}s for it to finish (--grace-period)")
        pass_on(s, child, grace)
        raise
    finally:
        terminate_group(child)


def _check_members(store: coordination.Store, ray_proc: subprocess.Popen, before: dict[int, str]) -> None:
    if ray_proc.poll() is not None:
        raise NodeLost("the head's Ray processes died while the command ran; see the Ray logs in the temp dir")
    lost = coordination.lost_since(store, before)
    if lost:
        raise NodeLost(f"lost node {', '.join(lost.values())} while the command ran; stopped the command", list(lost))


def start_fabric(plan: Plan, env: Mapping[str, str], command: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start the fabric check (fabric.py): a subprocess and a Ray driver in the command's environment, so it reaches
    the cluster as the command will, and a hung collective in it can be killed without harming this process. It
    starts a probe on each node as the node joins and measures once all have; `finish_fabric` waits for its verdict.
    Returns the process and the report's path."""
    report = os.path.join(plan.temp_dir, fabric.REPORT_NAME)
    command = command or [
        sys.executable,
        "-m",
        "rlrig.entrypoint.fabric",
        "--report",
        report,
        "--min-ratio",
        f"{plan.fabric_min_ratio:g}",
        "--nnodes",
        str(plan.spec.nnodes),
        "--wait",
        f"{plan.wait_timeout:g}",
    ]
    say("checking the fabric between the nodes before the command (skip with --no-fabric-check)")
    return subprocess.Popen(command, env=dict(env), start_new_session=True), report


def finish_fabric(
    child: subprocess.Popen, report: str, alive: Callable[[], None], timeout: float = FABRIC_TIMEOUT
) -> str:
    """Wait, from the moment every node joined, for the check's verdict; a RigError naming the bad node when it
    fails. Returns the report's path."""
    started = time.monotonic()
    try:
        while child.poll() is None:
            alive()
            if time.monotonic() > started + timeout:
                raise RigError(
                    f"fabric check: no verdict within {timeout:g}s, stopped it; a node may hang the "
                    "network (see the lines above); rerun with --no-fabric-check to skip it"
                )
            time.sleep(POLL)
    finally:
        terminate_group(child)
    if child.returncode != 0:
        raise FabricFailed(fabric.failure_message(report, child.returncode), fabric.failed_ranks(report))
    say(f"fabric check passed ({time.monotonic() - started:.1f}s after the nodes formed)")
    return report


def check_fabric(
    plan: Plan,
    env: Mapping[str, str],
    alive: Callable[[], None],
    timeout: float = FABRIC_TIMEOUT,
    command: list[str] | None = None,
) -> str:
    """The fabric check on a formed cluster (after a restart in place): start it and wait for its verdict."""
    child, report = start_fabric(plan, env, command)
    return finish_fabric(child, report, alive, timeout)


def probe_server(plan: Plan, wanted: bool) -> fabric_tcp.ProbeServer | None:
    """This node's end of the in-process fabric check (fabric_tcp), where a multi-node run checks the fabric."""
    if not (wanted and plan.fabric_check and plan.spec.nnodes > 1):
        return None
    return fabric_tcp.ProbeServer(plan.spec.node_ip, plan.token)


def my_facts(plan: Plan, probe: fabric_tcp.ProbeServer | None) -> dict:
    spec = plan.spec
    said = coordination.node_facts(spec.node_rank, spec.node_ip, plan.preflight.num_gpus, spec.node_name)
    return {**said, "probe": probe.address} if probe else said


def check_fabric_here(
    plan: Plan,
    probe: fabric_tcp.ProbeServer,
    store: coordination.Store,
    nodes: dict[int, dict],
    env: Mapping[str, str],
    alive: Callable[[], None],
) -> str:
    """The fabric check from this process (fabric_tcp) on the formed cluster, or on the Ray path where a node runs no
    probe of its own (it was started with --no-fabric-check); a FabricFailed naming the bad node when it fails.
    Returns the report's path."""
    said = coordination.facts(store)
    ranked = [
        {"rank": r, "host": said.get(r, {}).get("hostname", ""), "ip": n["ip"], "probe": said.get(r, {}).get("probe")}
        for r, n in sorted(nodes.items())
    ]
    if any(n["probe"] is None for n in ranked):
        return check_fabric(plan, env, alive)
    report = os.path.join(plan.temp_dir, fabric.REPORT_NAME)
    started = time.monotonic()
    code = fabric_tcp.run(ranked, probe, plan.token, plan.fabric_min_ratio, report)
    if code != 0:
        raise FabricFailed(fabric.failure_message(report, code), fabric.failed_ranks(report))
    say(f"fabric check passed ({time.monotonic() - started:.1f}s after the nodes formed)")
    return report


def start_ray(plan: Plan, command: list[str], env: dict[str, str], cluster: dict[str, str]) -> subprocess.Popen:
    metricsbind.write_shim(raystart.hook_dir(plan.temp_dir))
    say(f"before Ray starts: {prestart.one_line(prestart.select(env, cluster))}")
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=_ignore_the_warning_signal
    )


def _ignore_the_warning_signal() -> None:
    """SIGUSR1 is a preemption warning for rlrig and the trainer only. Slurm (`--signal`, srun's forwarding)
    delivers it to every process of a step, and Ray's daemons and workers would die of it (its default action);
    an ignored signal stays ignored through exec, so Ray's whole tree started from here lets it pass."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def run_head(plan: Plan) -> int:
    spec, pf, address = plan.spec, plan.preflight, plan.gcs_address
    say(
        f"head of {spec.nnodes} node(s) at {address} ({spec.launcher}), "
        f"{pf.num_cpus} CPU, {pf.num_gpus} GPU, temp {plan.temp_dir}"
    )
    ray_proc = start_ray(plan, plan.start_command, plan.ray_env, plan.cluster_env)
    alive = _head_ray_alive(ray_proc)
    store = None
    code = 1
    t0 = time.monotonic()
    command_env = {**plan.ray_env, "RAY_ADDRESS": address}
    fabric_wanted = plan.fabric_check and spec.nnodes > 1
    # a head without a GPU makes the check's backend TCP whatever the workers have: measured from this process
    probe = probe_server(plan, pf.num_gpus == 0)
    early = None  # the fabric check on the Ray path, started while the nodes join
    try:
        deadline = t0 + plan.wait_timeout
        store = coordination.connect(lambda: GcsStore.open(address), deadline, "head", address, alive)
        coordination.publish_head(store, plan.cluster_env, my_facts(plan, probe))
        if fabric_wanted and probe is None:  # its driver attaches to this node's raylet: once that is up, not before
            coordination.wait_for_rank(store, 0, deadline, alive)
            early = start_fabric(plan, command_env)
        nodes = coordination.wait_for_nodes(store, spec.nnodes, deadline, alive)
        coordination.check_versions(store)
        for line in resources.node_lines(nodes):
            say(line)
        if plan.standing:
            store.put(coordination.MODE, coordination.STANDING)
            say(
                f"cluster up: {len(nodes)} node(s) after {time.monotonic() - t0:.1f}s; job API {plan.dashboard_url} "
                "(rlrig submit -- CMD); stop it with rlrig down or SIGTERM"
            )
            code = standing.serve(store, alive, lambda: JobApi(plan.dashboard_url, plan.token), store.mark_job_failed)
            return code
        formed = time.monotonic() - t0
        restarts, failures = 0, NodeFailures(plan.base_env.get(EXCLUDE_FILE_ENV, ""))
        while True:
            if fabric_wanted:
                try:
                    if probe is not None:
                        report = check_fabric_here(plan, probe, store, nodes, command_env, alive)
                    else:
                        child, report = early or start_fabric(plan, command_env)  # again after a restart in place
                        early = None
                        report = finish_fabric(child, report, alive)
                    command_env[FABRIC_REPORT_ENV] = report
                except FabricFailed as bad:
                    _stop_at_a_second_failure(
                        failures, bad.ranks, known(store, nodes), "failed the fabric check", FabricFailed
                    )
                    if restarts >= plan.max_restarts or not bad.ranks:
                        raise
                    restarts += 1
                    say(f"restart {restarts}/{plan.max_restarts}: {bad}; checking again")
                    continue
            say(f"{len(nodes)} node(s) alive after {formed:.1f}s; running: {' '.join(plan.command)}")
            try:
                code = run_command(
                    plan.command,
                    {**command_env, RESTARTS_ENV: str(restarts)},
                    store,
                    ray_proc,
                    plan.grace_period,
                    SETTLE if restarts < plan.max_restarts else 0.0,
                )
            except NodeLost as lost:
                _stop_at_a_second_failure(
                    failures, lost.ranks, known(store, nodes), "lost while the command ran", NodeLost
                )
                if restarts >= plan.max_restarts or ray_proc.poll() is not None:  # without the head's Ray, no rejoin
                    raise
                restarts += 1
                nodes, formed = rejoin(plan, store, alive, lost, restarts)
                continue
            say(f"command exited with code {code}")
            k = known(store, nodes)
            twice = [said for said in (failures.add(r, k, what) for r, what in failures.hangs(store, k)) if said]
            if twice:
                say(twice[0])
                return code
            if code == HANG_EXIT and restarts < plan.max_restarts:
                restarts += 1  # every node is still here: the command alone runs again, from its last checkpoint
                say(f"restart {restarts}/{plan.max_restarts}: the command stopped on a hang; running it again")
                continue
            return code
    except Stop as s:
        code = s.code
        raise
    except RigError as e:
        code = e.exit_code
        raise
    finally:
        if early is not None:  # the job ended before the fabric check was waited for
            terminate_group(early[0])
        if probe is not None:
            probe.close()
        if store is not None:
            coordination.publish_exit(store, code)
        terminate_group(ray_proc)
        sweep_descendants()


def known(store: coordination.Store, nodes: dict[int, dict]) -> dict[int, dict]:
    """The nodes as Ray sees them (ip, alive) with what each said of itself when it joined (name, hostname)."""
    said = coordination.facts(store)
    return {r: {**n, **said.get(r, {})} for r, n in nodes.items()}


def _stop_at_a_second_failure(
    failures: NodeFailures, ranks: list[int], nodes: dict[int, dict], what: str, error: type[RigError]
) -> None:
    """Count `what` against each of `ranks`' nodes; raise `error` naming the first that has now failed twice."""
    twice = [said for said in (failures.add(r, nodes, what) for r in ranks) if said]
    if twice:
        raise error(twice[0], ranks)


def rejoin(
    plan: Plan, store: coordination.Store, alive: Callable[[], None], lost: NodeLost, restarts: int
) -> tuple[dict[int, dict], float]:
    """Restart in place: the command is stopped, the head's Ray stays up; wait for the lost ranks to come back
    (their launcher starts them again) and re-check them. Returns the nodes and how long the wait took."""
    say(
        f"restart {restarts}/{plan.max_restarts}: {lost}; waiting up to {plan.rejoin_timeout:g}s for every rank to "
        "rejoin (--rejoin-timeout), then running the command again"
    )
    t0 = time.monotonic()
    nodes = coordination.wait_for_nodes(
        store,
        plan.spec.nnodes,
        t0 + plan.rejoin_timeout,
        alive,
        hint="raise --rejoin-timeout or check that the launcher restarts lost nodes",
        error=NodeLost,
    )
    coordination.check_versions(store)
    say(f"restart {restarts}/{plan.max_restarts}: all {len(nodes)} node(s) back after {time.monotonic() - t0:.1f}s")
    return nodes, time.monotonic() - t0


def run_worker(plan: Plan) -> int:
    """Join the head and wait for its exit code. With --max-restarts, a worker that loses its head (or its own Ray)
    joins again, within --rejoin-timeout, the head its launcher starts again, up to that many times."""
    deadline = time.monotonic() + plan.wait_timeout
    for attempt in range(plan.max_restarts + 1):
        try:
            return serve_as_worker(plan, deadline)
        except NodeLost as lost:
            if attempt == plan.max_restarts:
                raise
            say(
                f"restart {attempt + 1}/{plan.max_restarts}: {lost}; joining the head again within "
                f"{plan.rejoin_timeout:g}s (--rejoin-timeout)"
            )
            deadline = time.monotonic() + plan.rejoin_timeout
    raise AssertionError("unreachable")  # the loop returns or raises


def serve_as_worker(plan: Plan, deadline: float) -> int:
    spec, address = plan.spec, plan.gcs_address
    say(f"worker rank {spec.node_rank}/{spec.nnodes} at {spec.node_ip} joining {address} ({spec.launcher})")
    store = coordination.connect(lambda: GcsStore.open(address), deadline, f"worker {spec.node_rank}", address)
    cluster = coordination.wait_for_env(store, deadline, address)
    probe = probe_server(plan, True)  # the head decides whether it measures from here (fabric_tcp) or over Ray
    try:
        coordination.announce(store, spec.node_rank, my_facts(plan, probe))
        return _serve_as_worker(plan, store, cluster)
    finally:
        if probe is not None:
            probe.close()


def _serve_as_worker(plan: Plan, store: coordination.Store, cluster: dict[str, str]) -> int:
    spec, address = plan.spec, plan.gcs_address
    env = plan.worker_ray_env(cluster)
    ray_proc = start_ray(plan, plan.worker_start_command(env), env, cluster)

    def alive() -> None:
        if ray_proc.poll() is not None:
            raise NodeLost(f"this node's Ray exited with code {ray_proc.returncode} (head gone or node evicted)")

    try:
        code = coordination.wait_for_exit(
            store, spec.node_rank, address, plan.head_loss_timeout, alive, ip=spec.node_ip if plan.standing else ""
        )
        say(f"head finished with code {code}; stopping")
        return code
    except Stop as s:
        # the whole job is being stopped: the head's command may still be finishing its step (and writing a
        # checkpoint) with this node's workers, so Ray stays up here until the head is done or the grace is over
        wait_out_the_head(plan, store, s, alive)
        raise
    finally:
        terminate_group(ray_proc)
        sweep_descendants()


def wait_out_the_head(plan: Plan, store: coordination.Store, stop: Stop, alive: Callable[[], None]) -> None:
    if plan.grace_period <= 0:
        return
    say(f"{stop}: keeping this node up to {plan.grace_period:g}s while the head finishes (--grace-period)")
    end = time.monotonic() + plan.grace_period

    def within() -> None:
        alive()
        if time.monotonic() > end:
            raise stop

    try:
        coordination.wait_for_exit(store, plan.spec.node_rank, plan.gcs_address, plan.head_loss_timeout, within)
    except NodeLost:
        pass  # the head is gone: nothing left to wait for


def run_existing(plan: Plan) -> int:
    address, env = plan.spec.existing_ray, plan.base_env
    say(f"Ray already runs here ({address}); starting nothing")
    child = subprocess.Popen(
        plan.command, env={**env, "RAY_ADDRESS": address} if address != "auto" else dict(env), start_new_session=True
    )
    try:
        return child.wait()
    finally:
        terminate_group(child)


def main(plan: Plan) -> int:
    if plan.spec.existing_ray:
        return run_existing(plan)
    say(f"token from {plan.token_source}")
    install_stop_handlers()
    # Our own GCS client reads the token from this process's environment.
    os.environ.update({k: plan.ray_env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN") if k in plan.ray_env})
    become_subreaper()
    try:
        return run_head(plan) if plan.spec.is_head else run_worker(plan)
    except Stop as s:
        say(f"stopped by {s}; everything rlrig started is stopped")
        return s.code
