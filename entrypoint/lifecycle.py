"""Carries out a Plan: start / wait / run / stop, on every node. Linear on purpose: read it top to bottom.

Head:   ray start --head -> publish env (several nodes, run/train: and where its fabric probe listens) -> (a GPU
        head: start the fabric check over Ray, fabric/driver.py) -> wait for nnodes -> compare versions -> the
        fabric check's verdict (a head without a GPU: measured from here, fabric/tcp.py) -> run CMD while
        watching nodes (command.py; `rlrig up`: serve submitted jobs, jobs/standing.py) -> publish exit code -> stop.
Worker: wait for the head's GCS -> read env -> (several nodes: its fabric probe) -> ray start --address until its
        node registers -> wait for the head's exit code (or notice the head is gone) -> stop.
What runs again after a failure (--max-restarts) is restarts.py; what is said to whom through the head's store is
cluster/coordination.py; this module owns the processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping

from . import command, restarts
from .cluster import coordination, identity, metricsbind, ports, prestart, raystart
from .cluster.gcs import GcsStore
from .cluster.processes import Stop, become_subreaper, install_stop_handlers, stop_ray, terminate_group
from .console import say
from .errors import NodeLost, RigError
from .fabric import tcp as fabric_tcp
from .jobs import standing
from .jobs.api import JobApi
from .plan import Plan
from .preflight import resources


def raises_once_exited(proc: subprocess.Popen, error: Callable[[int], RigError]) -> Callable[[], None]:
    """A check for the waits of coordination.py: raises error(exit code) once this node's `ray start` has exited."""

    def check() -> None:
        if proc.poll() is not None:
            raise error(proc.returncode)

    return check


def probe_server(plan: Plan, wanted: bool) -> fabric_tcp.ProbeServer | None:
    """This node's end of the in-process fabric check (fabric/tcp.py), where a multi-node run checks the fabric."""
    if not (wanted and command.fabric_wanted(plan)):
        return None
    return fabric_tcp.ProbeServer(plan.spec.node_ip, plan.token)


def my_facts(plan: Plan, probe: fabric_tcp.ProbeServer | None) -> dict:
    spec = plan.spec
    said = coordination.node_facts(spec.node_rank, spec.node_ip, plan.preflight.num_gpus, spec.node_name)
    return {**said, "probe": probe.address} if probe else said


def start_ray(plan: Plan, ray_start: list[str], env: dict[str, str], cluster: dict[str, str]) -> subprocess.Popen:
    metricsbind.write_shim(raystart.hook_dir(plan.temp_dir))
    say(f"before Ray starts: {prestart.one_line(prestart.select(env, cluster))}")
    return subprocess.Popen(
        ray_start, env=env, stdout=subprocess.DEVNULL, start_new_session=True, preexec_fn=_ignore_the_warning_signal
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
    ports.refuse_taken(plan.ports)  # before `ray start`: its GCS would fail, and this head would reach another's
    t0 = time.monotonic()
    ray_proc, store, alive = start_head_ray(plan, t0 + plan.wait_timeout)
    code = 1
    command_env = {**plan.ray_env, "RAY_ADDRESS": address}
    # a head without a GPU makes the check's backend TCP whatever the workers have: measured from this process
    probe = probe_server(plan, pf.num_gpus == 0)
    early = None  # the fabric check on the Ray path, started while the nodes join
    try:
        deadline = t0 + plan.wait_timeout
        identity.claim(store, plan.run, address)
        coordination.publish_head(store, plan.cluster_env, my_facts(plan, probe))
        phase(plan, "waiting for nodes")
        if command.fabric_wanted(plan) and probe is None:  # its driver attaches to this node's raylet: once it is up
            coordination.wait_for_rank(store, 0, deadline, alive)
            early = command.start_fabric(plan, command_env)
        nodes = coordination.wait_for_nodes(store, spec.nnodes, deadline, alive)
        coordination.check_versions(store)
        for line in node_lines(nodes):
            say(line)
        phase(plan, "running")
        if plan.standing:
            store.put(coordination.MODE, coordination.STANDING)
            say(
                f"cluster up: {len(nodes)} node(s) after {time.monotonic() - t0:.1f}s; job API {plan.dashboard_url} "
                "(rlrig submit -- CMD); stop it with rlrig down or SIGTERM"
            )
            code = standing.serve(store, alive, lambda: JobApi(plan.dashboard_url, plan.token), store.mark_job_failed)
            return code
        formed = restarts.FormedCluster(store, nodes, alive, ray_proc, command_env, probe, early, time.monotonic() - t0)
        code = restarts.run_head(plan, formed)
        return code
    except Stop as s:
        code = s.code
        raise
    except RigError as e:
        code = e.exit_code
        raise
    finally:
        phase(plan, "stopping")
        if early is not None:  # the job may have ended before the fabric check was waited for (a no-op if it was)
            terminate_group(early[0])
        if probe is not None:
            probe.close()
        if store is not None:
            coordination.publish_exit(store, code)
        stop_ray(ray_proc)


def node_lines(nodes: Mapping[int, dict]) -> list[str]:
    """`node rank 1 (gpu7, 10.0.0.2): CPU 16, GPU 8, v100 1`, one per node of a Store's node table:
    what Ray registered, so a mistyped RLRIG_RESOURCES or a missing GPU shows before a job asks for it."""
    # Ray leaves a resource it has none of out of the table; GPU 0 is said, since it is what one looks for
    return [
        f"node {coordination.describe(r, {r: {'hostname': n.get('host', '')}}, n['ip'])}: "
        f"{resources.summary({'GPU': 0, **n.get('resources', {})})}"
        for r, n in sorted(nodes.items())
    ]


def serve_as_worker(plan: Plan, deadline: float) -> int:
    spec, address = plan.spec, plan.gcs_address
    say(f"worker rank {spec.node_rank}/{spec.nnodes} at {spec.node_ip} joining {address} ({spec.launcher})")
    store = coordination.connect(lambda: GcsStore.open(address), deadline, f"worker {spec.node_rank}", address)
    cluster = coordination.wait_for_env(store, deadline, address)
    identity.check(store, plan.run, address, spec.node_rank)
    probe = probe_server(plan, True)  # the head decides whether it measures from here (fabric_tcp) or over Ray
    try:
        coordination.announce(store, spec.node_rank, my_facts(plan, probe))
        return _serve_as_worker(plan, store, cluster)
    finally:
        if probe is not None:
            probe.close()


# A joining node's raylet waits a fixed 15 s for its Python dashboard agent to write its ports (and exits when they
# come later), then Ray's start waits a fixed 30 s for the raylet to register with the GCS (ray/_private/node.py;
# neither has a setting). A node whose CPUs are busy, or a GCS busy with many nodes joining, fails a healthy node
# either way. A try that lasted SLOW_START_S was slow, not broken, and is tried again while --timeout allows; one
# that exits sooner (a refused token, another Ray version) counts to QUICK_START_TRIES.
SLOW_START_S = 15.0
QUICK_START_TRIES = 3


class _StartExited(RigError):
    pass


def start_worker_ray(
    plan: Plan,
    store: coordination.Store,
    env: dict[str, str],
    cluster: dict[str, str],
    deadline: float,
    slow_after: float = SLOW_START_S,
) -> subprocess.Popen:
    """This node's Ray, started until the head's GCS lists it alive: a `ray start` that exits before that (Ray's
    message is on stderr above) is started again: while --timeout allows when it ran past `slow_after` (Ray's own
    waits), else up to QUICK_START_TRIES times."""
    rank = plan.spec.node_rank

    def exited(code: int) -> RigError:
        return _StartExited(f"`ray start` exited with code {code} before this node registered")

    tries = quick = 0
    while True:
        tries += 1
        began = time.monotonic()
        ray_proc = start_ray(plan, plan.worker_start_command(env), env, cluster)
        try:
            coordination.wait_for_rank(store, rank, deadline, raises_once_exited(ray_proc, exited))
            return ray_proc
        except _StartExited as e:
            stop_ray(ray_proc)
            now = time.monotonic()
            quick += now - began < slow_after
            if quick == QUICK_START_TRIES or now >= deadline:
                why = "" if quick == QUICK_START_TRIES else " within --timeout"
                raise RigError(
                    f"this node's Ray did not join {plan.gcs_address} in {tries} tries{why}: {e}; Ray's reason is in "
                    "its output above"
                ) from None
            say(f"{e}; starting it again (try {tries + 1})")
        except BaseException:
            stop_ray(ray_proc)
            raise


def start_head_ray(
    plan: Plan,
    deadline: float,
    slow_after: float = SLOW_START_S,
    open_store: Callable[[str], coordination.Store] = GcsStore.open,
) -> tuple[subprocess.Popen, coordination.Store, Callable[[], None]]:
    """The head's Ray, its GCS, and the check that raises once that Ray exits. On a single node, a `ray start` that
    exits before its node registers after running past `slow_after` (Ray's own fixed waits, which busy cores exceed)
    is started again while --timeout allows, as a worker's is: no other node holds that GCS yet. A multi-node head
    starts once, since its workers may already be joining the GCS it started."""
    address, tries = plan.gcs_address, 0

    def exited(code: int) -> RigError:
        return _StartExited(f"head: `ray start` exited with code {code}; see its output above")

    while True:
        tries += 1
        began = time.monotonic()
        ray_proc = start_ray(plan, plan.start_command, plan.ray_env, plan.cluster_env)
        alive = raises_once_exited(ray_proc, exited)
        try:
            store = coordination.connect(lambda: open_store(address), deadline, "head", address, alive)
            if plan.spec.nnodes == 1:
                coordination.wait_for_rank(store, 0, deadline, alive)
            return ray_proc, store, alive
        except _StartExited as e:
            stop_ray(ray_proc)
            now = time.monotonic()
            if plan.spec.nnodes > 1 or now - began < slow_after or now >= deadline:
                raise RigError(f"{e}" + (f" (try {tries})" if tries > 1 else "")) from None
            say(f"{e} before its node registered; starting it again (try {tries + 1})")
        except BaseException:
            stop_ray(ray_proc)
            raise


def _serve_as_worker(plan: Plan, store: coordination.Store, cluster: dict[str, str]) -> int:
    spec, address = plan.spec, plan.gcs_address
    env = plan.worker_ray_env(cluster)
    # its own --timeout: a head that took most of the first to come up leaves this node the whole of it to join
    ray_proc = start_worker_ray(plan, store, env, cluster, time.monotonic() + plan.wait_timeout)
    phase(plan, "running")

    alive = raises_once_exited(
        ray_proc, lambda code: NodeLost(f"this node's Ray exited with code {code} (head gone or node evicted)")
    )

    try:
        code = coordination.wait_for_exit(
            store, spec.node_rank, address, plan.head_loss_timeout, alive, ip=spec.node_ip if plan.standing else ""
        )
        say(f"head finished with code {code}; stopping")
        return code
    except Stop as s:
        phase(plan, "stopping")
        # the whole job is being stopped: the head's command may still be finishing its step (and writing a
        # checkpoint) with this node's workers, so Ray stays up here until the head is done or the grace is over
        wait_out_the_head(plan, store, s, alive)
        raise
    finally:
        stop_ray(ray_proc)


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
    """The command on a Ray this process did not start (inside a Ray job, RAY_ADDRESS set): a stop signal is passed
    on to it with --grace-period to finish, as on a cluster of rlrig's own, so that stopping the job stops the run
    (the command runs in a session of its own, out of reach of a signal sent to this process's group)."""
    address, env = plan.spec.existing_ray, plan.base_env
    say(f"Ray already runs here ({address}); starting nothing")
    child = subprocess.Popen(
        plan.command, env={**env, "RAY_ADDRESS": address} if address != "auto" else dict(env), start_new_session=True
    )
    try:
        return child.wait()
    except Stop as s:
        command.hand_over(s, child, plan.grace_period)
        return s.code
    finally:
        terminate_group(child)


def phase(plan: Plan, what: str) -> None:
    """What `rlrig status --runs` shows this node doing (cluster/runs.py)."""
    if plan.record is not None:
        plan.record.phase(what)


def main(plan: Plan) -> int:
    install_stop_handlers()
    try:
        if plan.spec.existing_ray:
            return run_existing(plan)
        say(f"token from {plan.token_source}")
        # Our own GCS client reads the token from this process's environment.
        os.environ.update({k: plan.ray_env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN") if k in plan.ray_env})
        become_subreaper()
        return run_head(plan) if plan.spec.is_head else restarts.run_worker(plan, serve_as_worker)
    except Stop as s:
        say(f"stopped by {s}; everything rlrig started is stopped")
        return s.code
    finally:
        if plan.record is not None:
            plan.record.remove()
