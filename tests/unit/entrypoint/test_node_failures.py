"""A node that fails twice in one run (lost, or hosting a hung rank) is not restarted on: the run stops naming it
and both failures."""

import pytest

from rlrig.entrypoint import lifecycle
from rlrig.entrypoint.errors import HANG_EXIT, NodeLost
from rlrig.entrypoint.node_failures import HANG_REPORT_ENV, NodeFailures
from rlrig.trainer.driver import watchdog


@pytest.mark.parametrize(
    "events, stops_at",
    [
        ([("rank 1 (10.0.0.2)", "lost while the command ran")], None),
        ([("rank 1 (10.0.0.2)", "a"), ("rank 2 (10.0.0.3)", "b")], None),  # two nodes once each: restart
        ([("rank 1 (10.0.0.2)", "a"), ("rank 2 (10.0.0.3)", "b"), ("rank 1 (10.0.0.2)", "c")], 2),
    ],
)
def test_the_second_failure_of_a_node_stops_the_restarts(events, stops_at):
    f = NodeFailures()
    said = [f.add(node, what) for node, what in events]
    assert [i for i, s in enumerate(said) if s] == ([] if stops_at is None else [stops_at])
    if stops_at is not None:
        assert said[stops_at].startswith("rank 1 (10.0.0.2) failed twice in this run (a; c): not restarting on it;")
        assert "sbatch --exclude=HOST" in said[stops_at]


def test_the_trainer_and_the_entrypoint_agree_on_the_hang_contract():
    assert watchdog.HANG_EXIT == HANG_EXIT and watchdog.HANG_REPORT_ENV == HANG_REPORT_ENV


def test_a_lost_node_is_named_in_the_error(monkeypatch):
    from tests.helpers.entrypoint_fakes import MemoryStore

    store = MemoryStore()
    store.join(0, "10.0.0.1")
    store.join(1, "10.0.0.2")
    before = lifecycle.coordination.members(store)
    store.die(1)

    class Alive:
        def poll(self):
            return None

    with pytest.raises(NodeLost) as e:
        lifecycle._check_members(store, Alive(), before)
    assert e.value.nodes == ["rank 1 (10.0.0.2)"]
