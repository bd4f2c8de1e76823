"""`rlrig up` on the head once the cluster has formed: keep it serving jobs until SIGTERM/SIGINT or `rlrig down`.

A node lost meanwhile is named in the log, and every job running at that moment is stopped and recorded
as failed with that reason: its collectives would otherwise wait forever for the lost ranks. The cluster
itself keeps serving, and a node that comes back (its `rlrig up` started again) is welcomed.

A node that fails twice (lost, or hosting a rank a trainer's watchdog found hung) is drained: Ray schedules
nothing new there and stops it once it is idle, so the next jobs run on the other nodes; if it comes back it is
drained again. The head is never drained: that would end the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..cluster import coordination
from ..cluster.node_failures import NodeFailures
from ..console import say
from ..errors import RigError, Unreachable
from .api import ACTIVE, TERMINAL, JobApi

POLL = 1.0
STOP_WAIT = 20.0  # Ray's job stop sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s)
LOST_PREFIX = "rlrig: lost node"  # starts every job message written for a lost node; `rlrig submit` exits 3 on it


def fail_running_jobs(api: JobApi, mark_failed: Callable[[str, str], bool], reason: str) -> list[str]:
    """Stop every active job, then record each as FAILED with `reason`; returns their ids."""
    active = [j.submission_id for j in api.jobs() if j.status in ACTIVE]
    for sid in active:
        api.stop(sid)
    deadline = time.monotonic() + STOP_WAIT
    pending = list(active)
    while pending and time.monotonic() < deadline:
        pending = [sid for sid in pending if api.job(sid).status not in TERMINAL]
        if pending:
            time.sleep(0.2)
    failed = []
    for sid in active:
        if api.job(sid).status != "SUCCEEDED":  # one that finished on its own just before keeps its result
            mark_failed(sid, reason)
            failed.append(sid)
    return failed


def serve(
    store: coordination.Store,
    check_alive: Callable[[], None],
    api: Callable[[], JobApi],
    mark_failed: Callable[[str, str], bool],
    poll: float = POLL,
) -> int:
    """Returns 0 when `rlrig down` asked; signals arrive as processes.Stop. `api` connects on first use."""
    alive = {r: n["alive"] for r, n in store.nodes().items()}
    failures, drained = NodeFailures(), set()  # drained: the nodes' IPs, so that one that rejoins is drained again
    patience = coordination.Patience()
    while True:
        check_alive()
        with patience:  # a poll the GCS misses under load is tried again at the next poll
            if store.get(coordination.DOWN) is not None:
                say("rlrig down: stopping the cluster")
                return 0
            now = store.nodes()
            lost, back = coordination.node_changes(alive, now)
            known = coordination.facts(store) if lost or back else {}
            for r in back:
                say(f"node {coordination.describe(r, known, now[r]['ip'])} rejoined")
                for line in coordination.version_mismatches(known):
                    say(f"warn: {line}")
                if now[r]["ip"] in drained:
                    drain(store, r, now, known, f"{coordination.describe(r, known, now[r]['ip'])} failed twice before")
            for r in lost:
                name = coordination.describe(r, known, now.get(r, {}).get("ip", ""))
                if now.get(r, {}).get("ip") in drained:  # Ray stopped it once idle: no job of it to stop
                    say(f"drained node {name} left the cluster")
                    continue
                say(f"lost node {name}; the cluster keeps serving, and the node may rejoin with its `rlrig up`")
                reason = f"{LOST_PREFIX} {name} while the job ran; rlrig stopped the job"
                try:
                    failed = fail_running_jobs(api(), mark_failed, reason)
                except (Unreachable, RigError) as e:
                    say(f"warn: could not stop the running jobs through the job API: {e}")
                    continue
                if failed:
                    say(f"stopped and failed job(s) {', '.join(failed)}: node {name} was lost")
            for r, what in [(r, "lost while the cluster served") for r in lost] + failures.hangs(store, now):
                ip = now.get(r, {}).get("ip")
                if ip in drained:
                    continue
                facts = coordination.facts(store)
                twice = failures.count(r, {r: {**now.get(r, {}), **facts.get(r, {})}}, what)
                if twice and r == 0:
                    say(f"{twice}; not draining the head, which would end the cluster: replace its machine next time")
                elif twice:
                    drained.add(ip)
                    drain(store, r, now, facts, twice)
            alive = {r: n["alive"] for r, n in now.items()}
        time.sleep(poll)


def drain(store: coordination.Store, rank: int, now: dict[int, dict], known: dict[int, dict], why: str) -> None:
    """Ask Ray to drain rank's node (no new tasks, actors or placement groups there), and the node's `rlrig up` to
    stop its Ray and leave (coordination.wait_for_exit): Ray's drain alone stops a node only once Ray finds it
    idle, which a node with objects left in its store may never be."""
    node = now.get(rank, {})
    try:
        store.put(coordination.drained_key(node.get("ip", "")), why)
        if not node.get("alive"):
            say(f"{why}: it is gone; drained if it rejoins")
            return
        store.drain(node["id"], f"rlrig: {why}")
    except (Unreachable, RigError) as e:
        say(f"warn: could not drain {coordination.describe(rank, known, node.get('ip', ''))}: {e}")
        return
    say(f"{why}: drained it; the next jobs run on the other nodes (trainer.nnodes at most their number)")
