"""Restart in place (--max-restarts): what runs again after a failure, and when the run ends instead.

Head: the fabric check and the command on the formed cluster, in a loop that runs again, up to --max-restarts times,
after a failed fabric check (the check again), a node lost while the command ran (once the lost ranks rejoined, the
head's Ray staying up) and a hang (the command's exit HANG_EXIT, every node still there: the command alone). A node
that fails twice (node_failures) ends the run, named. Worker: a lost head is joined again, the next one its launcher
starts, within --rejoin-timeout.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import command
from .cluster import coordination
from .cluster.node_failures import EXCLUDE_FILE_ENV, NodeFailures
from .console import say
from .errors import HANG_EXIT, FabricFailed, NodeLost, RigError
from .fabric.tcp import ProbeServer
from .plan import Plan

RESTARTS_ENV = "RLRIG_RESTARTS"  # how many times the command was restarted in place (the trainer logs it)
SETTLE = 15.0  # Ray declares a killed node dead within ~7 s (raystart's health-check settings); a margin on top


@dataclass
class FormedCluster:
    """The head's formed cluster, as lifecycle hands it over: what each run of the check and the command needs."""

    store: coordination.Store
    nodes: dict[int, dict]  # Ray's view of the nodes by rank; a rejoin replaces it
    alive: Callable[[], None]  # raises when the head's own Ray died
    ray_proc: subprocess.Popen  # the head's `ray start`
    env: dict[str, str]  # the command's environment; the fabric check's report is added once it passed
    probe: ProbeServer | None  # the head measures from its own process (no GPU here); None: over Ray
    early: tuple[subprocess.Popen, str] | None  # the check over Ray started while the nodes joined, not waited for
    formed: float  # seconds the nodes took to form, or to rejoin after a restart


def run_head(plan: Plan, cluster: FormedCluster) -> int:
    """The fabric check (several nodes) and the command, run again in place while restarts are left. Returns the
    command's last exit code; raises the failure that ended the run."""
    restarts, failures = 0, NodeFailures(plan.base_env.get(EXCLUDE_FILE_ENV, ""))
    while True:
        if command.fabric_wanted(plan):
            try:
                cluster.env[command.FABRIC_REPORT_ENV] = check_fabric(plan, cluster)
            except FabricFailed as bad:
                stop_at_a_second_failure(
                    failures, bad.ranks, known(cluster.store, cluster.nodes), "failed the fabric check", FabricFailed
                )
                if restarts >= plan.max_restarts or not bad.ranks:
                    raise
                restarts += 1
                say(f"restart {restarts}/{plan.max_restarts}: {bad}; checking again")
                continue
        say(f"{len(cluster.nodes)} node(s) alive after {cluster.formed:.1f}s; running: {' '.join(plan.command)}")
        try:
            code = command.run_command(
                plan.command,
                {**cluster.env, RESTARTS_ENV: str(restarts)},
                cluster.store,
                cluster.ray_proc,
                plan.grace_period,
                SETTLE if restarts < plan.max_restarts else 0.0,
            )
        except NodeLost as lost:
            stop_at_a_second_failure(
                failures, lost.ranks, known(cluster.store, cluster.nodes), "lost while the command ran", NodeLost
            )
            # without the head's Ray, no rejoin
            if restarts >= plan.max_restarts or cluster.ray_proc.poll() is not None:
                raise
            restarts += 1
            cluster.nodes, cluster.formed = rejoin(plan, cluster.store, cluster.alive, lost, restarts)
            continue
        say(f"command exited with code {code}")
        k = known(cluster.store, cluster.nodes)
        twice = [said for said in (failures.add(r, k, what) for r, what in failures.hangs(cluster.store, k)) if said]
        if twice:
            say(twice[0])
            return code
        if code == HANG_EXIT and restarts < plan.max_restarts:
            restarts += 1  # every node is still here: the command alone runs again, from its last checkpoint
            say(f"restart {restarts}/{plan.max_restarts}: the command stopped on a hang; running it again")
            continue
        return code


def check_fabric(plan: Plan, cluster: FormedCluster) -> str:
    """One fabric check on the formed cluster: from this process where the head has a probe, else over Ray (the
    check started while the nodes joined, or a new one after a restart in place). Returns the report's path."""
    if cluster.probe is not None:
        return command.check_fabric_here(plan, cluster.probe, cluster.store, cluster.nodes, cluster.env, cluster.alive)
    child, report = cluster.early or command.start_fabric(plan, cluster.env)
    cluster.early = None
    return command.finish_fabric(child, report, cluster.alive)


def known(store: coordination.Store, nodes: dict[int, dict]) -> dict[int, dict]:
    """The nodes as Ray sees them (ip, alive) with what each said of itself when it joined (name, hostname)."""
    said = coordination.facts(store)
    return {r: {**n, **said.get(r, {})} for r, n in nodes.items()}


def stop_at_a_second_failure(
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


def run_worker(plan: Plan, serve: Callable[[Plan, float], int]) -> int:
    """Join the head and wait for its exit code (`serve(plan, deadline)`). With --max-restarts, a worker that loses
    its head (or its own Ray) joins again, within --rejoin-timeout, the head its launcher starts again, up to that
    many times."""
    deadline = time.monotonic() + plan.wait_timeout
    for attempt in range(plan.max_restarts + 1):
        try:
            return serve(plan, deadline)
        except NodeLost as lost:
            if attempt == plan.max_restarts:
                raise
            say(
                f"restart {attempt + 1}/{plan.max_restarts}: {lost}; joining the head again within "
                f"{plan.rejoin_timeout:g}s (--rejoin-timeout)"
            )
            deadline = time.monotonic() + plan.rejoin_timeout
    raise AssertionError("unreachable")  # the loop returns or raises
