"""Restart in place (--max-restarts): a node lost while the command runs stops it, the head waits for the rank to
rejoin and runs the command again; a worker that loses its head joins the next one. The real two-node run is in
tests/integration/test_recovery.py; here the decisions, on the in-memory store."""

import subprocess
import sys
import threading
import time

import pytest

from rlrig.entrypoint import command, restarts
from rlrig.entrypoint.detect.nodespec import NodeSpec
from rlrig.entrypoint.errors import NodeLost
from rlrig.entrypoint.plan import Plan
from tests.helpers.entrypoint_fakes import MemoryStore

pytestmark = pytest.mark.process


def two_nodes() -> MemoryStore:
    store = MemoryStore()
    store.join(0, "10.0.0.1")
    store.join(1, "10.0.0.2")
    return store


@pytest.fixture
def ray_stand_in():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()


@pytest.mark.parametrize(
    "settle, node_dies, outcome",
    [
        (3.0, True, NodeLost),  # the command saw its peer die first; Ray declares the node dead within the settle time
        (0.0, True, 1),  # no restarts left: the command's own exit code, as before
        (0.5, False, 1),  # a failure with every node still there is the command's own
    ],
)
def test_a_failed_command_is_a_lost_node_when_one_goes_within_the_settle_time(ray_stand_in, settle, node_dies, outcome):
    store = two_nodes()
    if node_dies:
        threading.Timer(0.5, store.die, (1,)).start()
    if outcome is NodeLost:
        with pytest.raises(NodeLost, match=r"lost node rank 1 \(10.0.0.2\)"):
            command.run_command(["false"], {}, store, ray_stand_in, settle=settle)
    else:
        started = time.monotonic()
        assert command.run_command(["false"], {}, store, ray_stand_in, settle=settle) == outcome
        assert time.monotonic() - started >= settle


def test_a_node_restarted_faster_than_ray_notices_still_stops_the_command(ray_stand_in):
    store = two_nodes()
    threading.Timer(0.3, store.join, (1, "10.0.0.2")).start()  # same rank, new Ray node, the old never seen dead
    started = time.monotonic()
    with pytest.raises(NodeLost, match="rank 1"):
        command.run_command(["sleep", "30"], {}, store, ray_stand_in)
    assert time.monotonic() - started < 5


def test_a_gcs_that_misses_polls_while_the_command_runs_does_not_stop_it(ray_stand_in):
    """The head's GCS answers no poll for 2.5 s (its calls time out on busy cores): the command runs to its end."""
    store = two_nodes()
    threading.Timer(0.5, setattr, (store, "down", True)).start()
    threading.Timer(3.0, setattr, (store, "down", False)).start()
    assert command.run_command(["sleep", "4"], {}, store, ray_stand_in) == 0


def plan(rank: int, max_restarts: int = 1, rejoin_timeout: float = 2.0) -> Plan:
    return Plan(
        NodeSpec("dstack", rank, 2, "10.0.0.1", head_address="10.0.0.1"),
        ["true"],
        {},
        max_restarts=max_restarts,
        rejoin_timeout=rejoin_timeout,
    )


@pytest.mark.parametrize("comes_back", [True, False])
def test_the_head_waits_for_the_lost_rank_within_the_rejoin_timeout(comes_back):
    store = two_nodes()
    store.die(1)
    if comes_back:
        threading.Timer(0.3, store.join, (1, "10.0.0.2")).start()
        nodes, waited = restarts.rejoin(plan(0), store, lambda: None, NodeLost("lost node rank 1"), 1)
        assert sorted(nodes) == [0, 1] and 0.2 < waited < 2
    else:
        with pytest.raises(NodeLost, match=r"missing rank\(s\): 1.*--rejoin-timeout") as e:
            restarts.rejoin(plan(0), store, lambda: None, NodeLost("lost node rank 1"), 1)
        assert e.value.exit_code == 3


@pytest.mark.parametrize(
    "max_restarts, losses, result",
    [
        (0, 1, NodeLost),  # the default: a lost head ends the worker, as before
        (1, 1, 0),  # joined the next head, which then finished with 0
        (2, 2, 0),
        (1, 2, NodeLost),  # more losses than restarts
    ],
)
def test_a_worker_joins_the_next_head_up_to_max_restarts(max_restarts, losses, result):
    calls = []

    def serve(p, deadline):
        calls.append(deadline - time.monotonic())
        if len(calls) <= losses:
            raise NodeLost("lost the head 10.0.0.1:6379: no answer for 30s")
        return 0

    p = plan(1, max_restarts, rejoin_timeout=7)
    if result is NodeLost:
        with pytest.raises(NodeLost):
            restarts.run_worker(p, serve)
    else:
        assert restarts.run_worker(p, serve) == result
    assert len(calls) == (max_restarts + 1 if result is NodeLost else losses + 1)
    assert calls[0] > 200 and all(6 < left <= 7 for left in calls[1:])  # --timeout first, then --rejoin-timeout


@pytest.mark.parametrize("sub, has", [("run", True), ("train", True), ("up", False)])
def test_max_restarts_is_an_option_of_run_and_train(sub, has):
    r = subprocess.run([sys.executable, "-m", "rlrig.entrypoint.cli", sub, "--help"], capture_output=True, text=True)
    assert ("--max-restarts" in r.stdout and "--rejoin-timeout" in r.stdout) is has


def test_a_bad_restart_count_is_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "run", "--max-restarts", "-1", "--", "true"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "not a whole number of restarts" in r.stderr
