"""A standing cluster drains a node that fails twice (hosting a hung rank, lost), again when it rejoins, and never
the head; on the in-memory store. The real one: tests/integration/test_standing.py."""

import threading
import time

import pytest

from rlrig.entrypoint.cluster import coordination
from rlrig.entrypoint.jobs import standing
from tests.helpers.entrypoint_fakes import MemoryStore


class NoJobs:
    def jobs(self):
        return []


def hang(store, job: str, ip: str, label: str = "rank 1", step: int = 2) -> None:
    store.put(f"hang/{job}", {"label": label, "ip": ip, "phase": "gen", "step": step})


@pytest.fixture
def cluster(capsys):
    store = MemoryStore()
    for r in range(3):
        store.join(r, f"10.0.0.{r + 1}")
        coordination.announce(store, r, {"rank": r, "ip": f"10.0.0.{r + 1}", "name": f"n{r + 1}"})
    t = threading.Thread(target=standing.serve, args=(store, lambda: None, NoJobs, lambda *a: True, 0.01))
    t.start()

    def until(ok, what):
        deadline = time.monotonic() + 5
        while not ok():
            assert time.monotonic() < deadline, f"{what}: {capsys.readouterr().err}"
            time.sleep(0.01)

    yield store, until
    store.put(coordination.DOWN, 1)
    t.join(5)
    assert not t.is_alive()


def test_a_node_that_hangs_twice_is_drained_and_again_when_it_rejoins(cluster, capsys):
    store, until = cluster
    hang(store, "01000000", "10.0.0.2")
    time.sleep(0.1)
    assert store.drained == []  # once is not twice
    hang(store, "02000000", "10.0.0.3")  # another node, once
    hang(store, "03000000", "10.0.0.2", step=3)
    until(lambda: store.drained, "no drain")
    why = "rank 1 (n2, 10.0.0.2) failed twice (rank 1 hung in gen at step 2; rank 1 hung in gen at step 3)"
    assert store.drained == [("node2", f"rlrig: {why}")]
    assert store.get(coordination.drained_key("10.0.0.2")) == why  # for its rlrig up, which leaves on it
    # Ray stops it once idle, which fails no job; its launcher starts it again: drained again
    store.die(1)
    until(lambda: "drained node rank 1 (n2, 10.0.0.2) left the cluster" in capsys.readouterr().err, "not seen gone")
    store.join(1, "10.0.0.2")
    until(lambda: len(store.drained) == 2, "not drained again")
    assert store.drained[1] == ("node4", "rlrig: rank 1 (n2, 10.0.0.2) failed twice before")


def test_a_node_lost_twice_is_drained_when_it_comes_back(cluster, capsys):
    store, until = cluster
    for _ in range(2):
        store.die(2)
        until(lambda: "lost node rank 2" in capsys.readouterr().err, "not seen lost")
        store.join(2, "10.0.0.3")
        until(lambda: "rank 2 (n3, 10.0.0.3) rejoined" in capsys.readouterr().err, "not seen back")
    until(lambda: store.drained, "not drained")
    assert store.drained == [("node5", "rlrig: rank 2 (n3, 10.0.0.3) failed twice before")]  # its third Ray node


def test_the_head_is_never_drained(cluster, capsys):
    store, until = cluster
    hang(store, "01000000", "10.0.0.1", label="rank 0")
    hang(store, "02000000", "10.0.0.1", label="rank 0")
    until(lambda: "not draining the head" in capsys.readouterr().err, "no line about the head")
    assert store.drained == []


def test_a_drained_node_leaves_and_another_machine_in_its_rank_does_not():
    from rlrig.entrypoint.errors import NodeLost

    store = MemoryStore()
    store.put(coordination.drained_key("10.0.0.2"), "rank 1 (n2, 10.0.0.2) failed twice (a; b)")
    with pytest.raises(NodeLost, match=r"^the head drained this node: rank 1 \(n2, 10.0.0.2\) failed twice \(a; b\)"):
        coordination.wait_for_exit(store, 1, "10.0.0.1:6379", head_loss_timeout=5, poll=0.01, ip="10.0.0.2")
    store.put(coordination.EXIT, 0)
    assert coordination.wait_for_exit(store, 1, "10.0.0.1:6379", head_loss_timeout=5, poll=0.01, ip="10.0.0.7") == 0


def test_a_gcs_that_misses_polls_leaves_the_cluster_serving():
    """The head's GCS answers no poll for a while (its calls time out on busy cores): the cluster serves on, and
    `rlrig down` afterwards still ends it with 0."""
    store = MemoryStore()
    store.join(0, "10.0.0.1")
    ended = []
    t = threading.Thread(
        target=lambda: ended.append(standing.serve(store, lambda: None, NoJobs, lambda *a: True, 0.01))
    )
    t.start()
    time.sleep(0.1)
    store.down = True
    time.sleep(0.3)  # some thirty polls missed
    store.down = False
    assert t.is_alive()
    store.put(coordination.DOWN, 1)
    t.join(5)
    assert ended == [0]
