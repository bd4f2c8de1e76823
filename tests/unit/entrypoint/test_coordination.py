"""The head/worker protocol against an in-memory store: no Ray, no root, no network."""

import socket
import threading
import time

import pytest

from rlrig.entrypoint.cluster import coordination as co
from rlrig.entrypoint.errors import NodeLost, RigError, Unreachable
from tests.helpers.entrypoint_fakes import MemoryStore

ADDRESS = "10.0.0.1:6379"


def facts(rank, **kw):
    base = {
        "rank": rank,
        "ip": f"10.0.0.{rank + 1}",
        "hostname": f"n{rank}",
        "ray": "2.60.0",
        "python": "3.11.7",
        "rlrig": "0.1.0",
        "gpus": 8,
    }
    return {**base, **kw}


def soon(seconds=5.0):
    return time.monotonic() + seconds


def test_head_and_workers_form_a_cluster_and_agree_on_the_exit_code():
    store, nnodes = MemoryStore(), 3
    results, errors = {}, []

    def worker(rank):
        try:
            env = co.wait_for_env(store, soon(), ADDRESS, poll=0.01)
            co.announce(store, rank, facts(rank))
            store.join(rank, f"10.0.0.{rank + 1}")  # its raylet joined
            results[rank] = (env, co.wait_for_exit(store, rank, ADDRESS, head_loss_timeout=5, poll=0.01))
        except BaseException as e:  # noqa: BLE001 -- handed to the main thread, which fails the test with it
            errors.append(e)

    # daemons: a failed assertion below must not leave the suite waiting on them
    threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(1, nnodes)]
    for t in threads:
        t.start()
    time.sleep(0.05)  # workers poll before the head has published anything
    co.publish_head(store, {"VLLM_X": "1"}, facts(0))
    store.join(0, "10.0.0.1")
    nodes = co.wait_for_nodes(store, nnodes, soon(), poll=0.01)
    co.check_versions(store)
    assert sorted(nodes) == [0, 1, 2] and co.lost_since(store, co.members(store)) == {}
    t0 = time.monotonic()
    co.publish_exit(store, 7, wait=5, poll=0.01)
    assert time.monotonic() - t0 < 4, "the head waited its whole grace period although every worker acknowledged"
    for t in threads:
        t.join(5)
    assert not errors, errors
    assert results == {1: ({"VLLM_X": "1"}, 7), 2: ({"VLLM_X": "1"}, 7)}
    assert store.get("ack/1") is True and store.get("ack/2") is True


def test_missing_rank_is_named_with_what_it_reported():
    store = MemoryStore()
    co.publish_head(store, {}, facts(0))
    store.join(0, "10.0.0.1")
    co.announce(store, 1, facts(1))  # reached the head, its raylet never joined
    with pytest.raises(RigError) as e:
        co.wait_for_nodes(store, 3, soon(0.05), poll=0.01)
    assert str(e.value).startswith(
        "1/3 nodes joined before the timeout; missing rank(s): "
        "1 (reached the head from 10.0.0.2 but its raylet did not join), 2;"
    )


def test_missing_rank_message_carries_version_mismatches():
    store = MemoryStore()
    co.publish_head(store, {}, facts(0))
    store.join(0, "10.0.0.1")
    co.announce(store, 1, facts(1, ray="2.50.0"))
    with pytest.raises(RigError, match="node 1 \\(10.0.0.2\\) has ray 2.50.0 but the head has 2.60.0"):
        co.wait_for_nodes(store, 2, soon(0.05), poll=0.01)


MISMATCHES = [
    ("equal", {}, {}, []),
    ("ray", {"ray": "2.59.0"}, {}, ["node 1 (10.0.0.2) has ray 2.59.0 but the head has 2.60.0"]),
    (
        "python on one, gpus on another",
        {"python": "3.12.1"},
        {"gpus": 4},
        [
            "node 1 (10.0.0.2) has python 3.12.1 but the head has 3.11.7",
            "node 2 (10.0.0.3) has gpus 4 but the head has 8",
        ],
    ),
    (
        "rlrig missing",
        {"rlrig": "missing"},
        {"rlrig": "missing"},
        [
            "node 1 (10.0.0.2) has rlrig missing but the head has 0.1.0",
            "node 2 (10.0.0.3) has rlrig missing but the head has 0.1.0",
        ],
    ),
]


@pytest.mark.parametrize("one,two,lines", [r[1:] for r in MISMATCHES], ids=[r[0] for r in MISMATCHES])
def test_version_mismatches_list_each_differing_node(one, two, lines):
    known = {0: facts(0), 1: facts(1, **one), 2: facts(2, **two)}
    assert co.version_mismatches(known) == lines
    store = MemoryStore()
    for rank, f in known.items():
        co.announce(store, rank, f)
    if lines:
        with pytest.raises(RigError) as e:
            co.check_versions(store)
        assert (
            str(e.value)
            == "nodes differ: " + "; ".join(lines) + "; install the same versions on every node (one image)"
        )
    else:
        co.check_versions(store)


def test_no_head_facts_no_mismatch():
    assert co.version_mismatches({1: facts(1, ray="1.0")}) == []


@pytest.mark.parametrize(
    "then, lost",
    [
        (lambda s: None, {}),
        (lambda s: s.die(1), {1: "rank 1 (10.0.0.2)"}),
        # restarted by its launcher before Ray declared the old one dead: the same rank, alive, on a new Ray node
        (lambda s: s.join(1, "10.0.0.2"), {1: "rank 1 (10.0.0.2)"}),
        (lambda s: s.table.pop(1), {1: "rank 1 (?)"}),
    ],
)
def test_a_rank_no_longer_served_by_the_same_node_is_lost(then, lost):
    store = MemoryStore()
    store.join(0, "10.0.0.1")
    store.join(1, "10.0.0.2")
    before = co.members(store)
    then(store)
    assert co.lost_since(store, before) == lost


@pytest.mark.parametrize("comes_up_after, ok", [(0, True), (0.2, True), (None, False)])
def test_the_head_waits_for_its_own_ray_node(comes_up_after, ok):
    store = MemoryStore()
    store.join(1, "10.0.0.2")  # a worker's raylet may register first: it is not the one a driver on the head needs
    if comes_up_after is not None:
        threading.Timer(comes_up_after, store.join, (0, "10.0.0.1")).start()
        time.sleep(0.01 if comes_up_after else 0.05)
    if ok:
        co.wait_for_rank(store, 0, soon(), poll=0.01)
        assert store.nodes()[0]["alive"]
    else:
        with pytest.raises(RigError, match="rank 0's Ray node did not register"):
            co.wait_for_rank(store, 0, time.monotonic() + 0.2, poll=0.01)


def test_worker_declares_the_head_lost_after_its_timeout():
    store = MemoryStore()
    store.down = True
    t0 = time.monotonic()
    with pytest.raises(NodeLost, match=f"lost the head {ADDRESS}") as e:
        co.wait_for_exit(store, 1, ADDRESS, head_loss_timeout=0.2, poll=0.01)
    assert e.value.exit_code == 3 and time.monotonic() - t0 < 2


def test_worker_rides_out_a_short_outage():
    store = MemoryStore()
    store.down = True

    def recover():
        time.sleep(0.1)
        store.down = False
        store.put("exit", 0)

    threading.Thread(target=recover).start()
    assert co.wait_for_exit(store, 1, ADDRESS, head_loss_timeout=3, poll=0.01) == 0


def test_worker_stops_when_its_own_ray_dies():
    def ray_died():
        raise NodeLost("this node's Ray exited")

    with pytest.raises(NodeLost, match="this node's Ray exited"):
        co.wait_for_exit(MemoryStore(), 1, ADDRESS, head_loss_timeout=3, check_alive=ray_died, poll=0.01)


# polls as (seconds since the last answer, what the poll raised): the head's watch over its nodes
PATIENCE = [
    ("a missed poll is asked again", [(1.0, Unreachable("deadline"))], None),
    ("misses up to the bound", [(10.0, Unreachable("deadline")), (29.0, Unreachable("deadline"))], None),
    ("silent past the bound: the job stops", [(31.0, Unreachable("deadline"))], NodeLost),
    ("an answer restarts the count", [(29.0, None), (58.0, Unreachable("deadline"))], None),
    ("anything else is not a missed poll", [(1.0, KeyError("bug"))], KeyError),
]


@pytest.mark.parametrize("polls, raises", [r[1:] for r in PATIENCE], ids=[r[0] for r in PATIENCE])
def test_the_head_bears_a_silent_gcs_up_to_its_bound(polls, raises):
    now = [0.0]
    patience = co.Patience(silent_s=30.0, clock=lambda: now[0])
    seen = None
    for at, error in polls:
        now[0] = at
        try:
            with patience:
                if error is not None:
                    raise error
        except (NodeLost, KeyError) as e:
            seen = type(e)
            assert at == polls[-1][0]
    assert seen is raises


@pytest.mark.parametrize("silent_s, ok", [(0.3, True), (None, False)])
def test_the_head_waiting_for_its_nodes_asks_a_silent_gcs_again_until_the_deadline(silent_s, ok):
    """A GCS busy starting (or on busy cores) misses polls: the wait goes on; silent to the deadline, one line."""
    store = MemoryStore()
    store.join(0, "10.0.0.1")
    store.down = True
    if silent_s:
        threading.Timer(silent_s, setattr, (store, "down", False)).start()
    if ok:
        assert set(co.wait_for_nodes(store, 1, time.monotonic() + 5, poll=0.01)) == {0}
        co.wait_for_rank(store, 0, time.monotonic() + 5, poll=0.01)
    else:
        with pytest.raises(RigError, match="the head's GCS did not answer in time"):
            co.wait_for_nodes(store, 1, time.monotonic() + 0.3, poll=0.01)
        with pytest.raises(RigError, match="did not register with the GCS in time"):
            co.wait_for_rank(store, 0, time.monotonic() + 0.3, poll=0.01)


def test_publish_exit_gives_up_quietly_when_the_gcs_is_gone():
    store = MemoryStore()
    store.down = True
    co.publish_exit(store, 3, wait=1)


class Broken(MemoryStore):
    def nodes(self, timeout=2.0):
        raise KeyError("a bug, not a lost head")


def test_publish_exit_lets_a_bug_through():
    with pytest.raises(KeyError):
        co.publish_exit(Broken(), 0, wait=1)


def test_connect_retries_until_the_head_answers():
    store, calls = MemoryStore(), []

    def open_store():
        calls.append(1)
        if len(calls) < 3:
            raise Unreachable("not yet")
        return store

    assert co.connect(open_store, soon(), "worker 1", ADDRESS, poll=0.01) is store and len(calls) == 3


def test_connect_times_out_with_the_address():
    def never():
        raise Unreachable("port closed")

    with pytest.raises(RigError, match=f"worker 1: no Ray head answered at {ADDRESS} in time"):
        co.connect(never, soon(0.05), "worker 1", ADDRESS, poll=0.01)


@pytest.mark.parametrize(
    "bug", [TypeError("bad argument"), AttributeError("no such method"), ValueError("bad address")]
)
def test_connect_lets_anything_but_a_connection_error_through(bug):
    def buggy():
        raise bug

    with pytest.raises(type(bug)):
        co.connect(buggy, soon(), "head", ADDRESS, poll=0.01)


def test_connect_stops_when_this_nodes_ray_died():
    def died():
        raise RigError("head: `ray start` exited with code 1")

    def never():
        raise Unreachable("port closed")

    with pytest.raises(RigError, match="ray start"):
        co.connect(never, soon(), "head", ADDRESS, check_alive=died, poll=0.01)


def test_env_wait_survives_an_outage_and_times_out_with_a_clear_error():
    store = MemoryStore()
    store.down = True
    with pytest.raises(RigError, match="never published the cluster environment"):
        co.wait_for_env(store, soon(0.05), ADDRESS, poll=0.01)


# --- the GCS adapter: Ray's connection errors become Unreachable, nothing else does ---------------


class FakeClient:
    def __init__(self, error=None):
        self.error, self.kv = error, {}

    def _maybe_fail(self):
        if self.error is not None:
            raise self.error

    def internal_kv_put(self, key, value, overwrite, ns, timeout=None):
        self._maybe_fail()
        self.kv[key] = value

    def internal_kv_get(self, key, ns, timeout=None):
        self._maybe_fail()
        return self.kv.get(key)

    def internal_kv_keys(self, prefix, ns, timeout=None):
        self._maybe_fail()
        return [k for k in self.kv if k.startswith(prefix)]

    def get_all_node_info(self, timeout=None):
        self._maybe_fail()

        class Info:
            def __init__(self, rank, state, ip):
                self.labels = {} if rank is None else {co.RANK_LABEL: str(rank), co.HOST_LABEL: f"gpu{rank}"}
                self.state, self.node_manager_address = state, ip
                self.resources_total = {"CPU": 8.0, f"node:{ip}": 1.0}

        return {
            bytes([i]): info
            for i, info in enumerate(
                [
                    Info(0, 0, "10.0.0.1"),
                    Info(1, 0, "10.0.0.2"),
                    Info(1, 1, "10.0.0.9"),
                    Info(2, 1, "10.0.0.3"),
                    Info(None, 0, "10.0.0.8"),
                ]
            )
        }


def test_gcs_store_round_trip_and_node_table():
    from rlrig.entrypoint.cluster.gcs import GcsStore

    store = GcsStore(FakeClient(), ADDRESS)
    store.put("node/1", facts(1))
    assert store.get("node/1") == facts(1) and store.get("absent") is None and store.keys("node/") == ["node/1"]
    # a restarted rank 1 left a dead record: the alive one wins; unlabelled nodes are not ours
    assert {r: (n["alive"], n["ip"]) for r, n in store.nodes().items()} == {
        0: (True, "10.0.0.1"),
        1: (True, "10.0.0.2"),
        2: (False, "10.0.0.3"),
    }
    # what the head's log shows per node once the cluster formed (lifecycle.node_lines)
    assert store.nodes()[1]["id"] == "01"  # Ray's node id: a rank restarted on a new node gets a new one
    assert store.nodes()[1]["host"] == "gpu1" and store.nodes()[1]["resources"] == {"CPU": 8.0, "node:10.0.0.2": 1.0}


def ray_connection_errors():
    from ray.exceptions import RpcError

    return [
        RpcError("Timed out while waiting for GCS to become available."),
        ConnectionResetError(104, "reset"),
        TimeoutError("timed out"),
    ]


@pytest.mark.parametrize("call", ["put", "get", "keys", "nodes"])
def test_gcs_store_turns_connection_errors_into_unreachable(call):
    from rlrig.entrypoint.cluster.gcs import GcsStore

    args = {"put": ("k", 1), "get": ("k",), "keys": ("node/",), "nodes": ()}[call]
    for error in ray_connection_errors():
        with pytest.raises(Unreachable):
            getattr(GcsStore(FakeClient(error), ADDRESS), call)(*args)
    with pytest.raises(ZeroDivisionError):  # a bug stays a bug
        getattr(GcsStore(FakeClient(ZeroDivisionError()), ADDRESS), call)(*args)


def test_gcs_open_on_a_closed_port_is_unreachable_at_once():
    from rlrig.entrypoint.cluster.gcs import GcsStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(Unreachable):
        GcsStore.open(f"127.0.0.1:{port}")
    assert time.monotonic() - t0 < 5
