"""A node that fails twice in one run (lost, hosting a hung rank, failing the fabric check) is not restarted on: the
run stops naming it and both failures, and names it in RLRIG_EXCLUDE_FILE for a launcher that has a spare."""

import pytest

from rlrig.entrypoint import command, restarts
from rlrig.entrypoint.cluster.gcs import NS
from rlrig.entrypoint.cluster.node_failures import HANG_KEY_PREFIX, NodeFailures
from rlrig.entrypoint.errors import HANG_EXIT, FabricFailed, NodeLost
from rlrig.trainer.driver import watchdog

NODES = {
    0: {"ip": "10.0.0.1", "name": "node1"},
    1: {"ip": "10.0.0.2", "name": "node2"},
    2: {"ip": "10.0.0.3", "name": "node3"},
}


@pytest.mark.parametrize(
    "events, stops_at",
    [
        ([(1, "lost while the command ran")], None),
        ([(1, "a"), (2, "b")], None),  # two nodes once each: restart
        ([(1, "a"), (2, "b"), (1, "c")], 2),
    ],
)
def test_the_second_failure_of_a_node_stops_the_restarts(events, stops_at):
    f = NodeFailures()
    said = [f.add(rank, NODES, what) for rank, what in events]
    assert [i for i, s in enumerate(said) if s] == ([] if stops_at is None else [stops_at])
    if stops_at is not None:
        assert said[stops_at].startswith("rank 1 (node2, 10.0.0.2) failed twice in this run (a; c): not restarting")
        assert "sbatch --exclude=node2" in said[stops_at]


def test_a_node_is_its_address_whatever_rank_it_rejoins_as():
    f = NodeFailures()
    assert f.add(1, NODES, "a") is None
    swapped = {1: NODES[2], 2: NODES[1]}
    assert f.add(2, swapped, "b").startswith("rank 2 (node2, 10.0.0.2) failed twice in this run (a; b)")


def test_the_node_that_failed_twice_is_named_in_the_exclude_file(tmp_path):
    exclude = tmp_path / "job.exclude"
    exclude.write_text("node5\n")  # an earlier step's
    f = NodeFailures(str(exclude))
    f.add(2, NODES, "a")
    said = f.add(2, NODES, "b")
    assert said.endswith(
        f"not restarting on it; named node3 in {exclude} (RLRIG_EXCLUDE_FILE) for the launcher to leave out"
    )
    assert exclude.read_text() == "node5\nnode3\n"


def test_the_trainer_and_the_entrypoint_agree_on_the_hang_contract():
    assert watchdog.HANG_EXIT == HANG_EXIT
    assert (watchdog.HANG_KEY_PREFIX, watchdog.KV_NAMESPACE) == (HANG_KEY_PREFIX, NS)


def test_a_lost_node_is_named_in_the_error(monkeypatch):
    from tests.helpers.entrypoint_fakes import MemoryStore

    store = MemoryStore()
    store.join(0, "10.0.0.1")
    store.join(1, "10.0.0.2")
    before = command.coordination.members(store)
    store.die(1)

    class Alive:
        def poll(self):
            return None

    with pytest.raises(NodeLost) as e:
        command._check_members(store, Alive(), before)
    assert e.value.ranks == [1] and "lost node rank 1 (10.0.0.2) while the command ran" in str(e.value)


@pytest.mark.parametrize("error", [NodeLost, FabricFailed])
def test_a_second_failure_ends_the_run_as_the_first_would_have(error):
    f = NodeFailures()
    restarts.stop_at_a_second_failure(f, [1, 2], NODES, "failed the fabric check", error)  # once each: goes on
    with pytest.raises(error) as e:
        restarts.stop_at_a_second_failure(f, [2], NODES, "lost while the command ran", error)
    assert str(e.value).startswith(
        "rank 2 (node3, 10.0.0.3) failed twice in this run (failed the fabric check; lost while the command ran)"
    )
    assert e.value.ranks == [2]
