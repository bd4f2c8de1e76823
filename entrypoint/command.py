"""The head's steps on a formed cluster: the fabric check's verdict, then the command, stopped when a node is lost.

lifecycle forms the cluster and restarts decides what runs again; this module runs one fabric check or one command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

from .cluster import coordination
from .cluster.processes import Stop, pass_on, terminate_group
from .console import say
from .errors import FabricFailed, NodeLost, RigError
from .fabric import report as fabric_report
from .fabric import tcp as fabric_tcp
from .plan import Plan

POLL = 0.2
FABRIC_REPORT_ENV = (
    "RLRIG_FABRIC_REPORT"  # the command learns where the fabric check's report is (the trainer copies it)
)
FABRIC_TIMEOUT = 60.0  # the fabric check's own budget is 50 s; past this it is killed and the job stops


def fabric_wanted(plan: Plan) -> bool:
    """A multi-node run or train checks the fabric before its command (unless --no-fabric-check)."""
    return plan.fabric_check and plan.spec.nnodes > 1


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
    patience = coordination.Patience()
    child = subprocess.Popen(cmd, env=dict(env), start_new_session=True)
    try:
        next_check = time.monotonic() + 1.0
        while child.poll() is None:
            time.sleep(POLL)
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + 1.0
            with patience:
                _check_members(store, ray_proc, before)
        if child.returncode != 0 and settle > 0:
            end = time.monotonic() + settle
            while time.monotonic() < end:
                with patience:
                    _check_members(store, ray_proc, before)
                time.sleep(POLL)
        return child.returncode
    except Stop as s:
        hand_over(s, child, grace)
        raise
    finally:
        terminate_group(child)


def hand_over(stop: Stop, child: subprocess.Popen, grace: float) -> None:
    """The stop signal passed on to the command, said when it gets `grace` seconds to finish (processes.pass_on)."""
    if grace > 0:
        say(f"{stop}: passed to the command; up to {grace:g}s for it to finish (--grace-period)")
    pass_on(stop, child, grace)


def _check_members(store: coordination.Store, ray_proc: subprocess.Popen, before: dict[int, str]) -> None:
    if ray_proc.poll() is not None:
        raise NodeLost("the head's Ray processes died while the command ran; see the Ray logs in the temp dir")
    lost = coordination.lost_since(store, before)
    if lost:
        raise NodeLost(f"lost node {', '.join(lost.values())} while the command ran; stopped the command", list(lost))


def start_fabric(plan: Plan, env: Mapping[str, str], command: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """Start the fabric check over Ray (fabric/driver.py): a subprocess and a Ray driver in the command's environment,
    so it reaches the cluster as the command will, and a hung collective in it can be killed without harming this
    process. It starts a probe on each node as the node joins and measures once all have; `finish_fabric` waits for
    its verdict.
    Returns the process and the report's path."""
    report = os.path.join(plan.temp_dir, fabric_report.REPORT_NAME)
    command = command or [
        sys.executable,
        "-m",
        "rlrig.entrypoint.fabric.driver",
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
        raise FabricFailed(fabric_report.failure_message(report, child.returncode), fabric_report.failed_ranks(report))
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


def check_fabric_here(
    plan: Plan,
    probe: fabric_tcp.ProbeServer,
    store: coordination.Store,
    nodes: dict[int, dict],
    env: Mapping[str, str],
    alive: Callable[[], None],
) -> str:
    """The fabric check from this process (fabric/tcp.py) on the formed cluster, or on the Ray path where a node runs no
    probe of its own (it was started with --no-fabric-check); a FabricFailed naming the bad node when it fails.
    Returns the report's path."""
    said = coordination.facts(store)
    ranked = [
        {"rank": r, "host": said.get(r, {}).get("hostname", ""), "ip": n["ip"], "probe": said.get(r, {}).get("probe")}
        for r, n in sorted(nodes.items())
    ]
    if any(n["probe"] is None for n in ranked):
        return check_fabric(plan, env, alive)
    report = os.path.join(plan.temp_dir, fabric_report.REPORT_NAME)
    started = time.monotonic()
    code = fabric_tcp.run(ranked, probe, plan.token, plan.fabric_min_ratio, report)
    if code != 0:
        raise FabricFailed(fabric_report.failure_message(report, code), fabric_report.failed_ranks(report))
    say(f"fabric check passed ({time.monotonic() - started:.1f}s after the nodes formed)")
    return report
