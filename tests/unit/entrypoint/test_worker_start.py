"""A worker's `ray start` that exits before its node registers with the head is started again: while --timeout allows
when the try lasted as long as Ray's own fixed waits (15 s for the dashboard agent, 30 s to register, which a node
with busy CPUs or a GCS busy with many nodes joining can exceed), three times when it exited sooner; what each try
started is stopped, and the last failure says how many tries it took."""

import time

import psutil
import pytest

from rlrig.entrypoint import lifecycle
from rlrig.entrypoint.detect.nodespec import NodeSpec
from rlrig.entrypoint.errors import RigError
from rlrig.entrypoint.plan import Plan
from tests.helpers.entrypoint_fakes import MemoryStore

pytestmark = pytest.mark.process

# a stand-in for `ray start --block`: the first `fails` starts exit 1 (after 0.3 s) as Ray's does on its startup
# timeout; a later one registers (when `registers`) and keeps running as a node does
START = (
    "n=$(($(cat {d}/tries 2>/dev/null || echo 0) + 1)); echo $n > {d}/tries; "
    "[ $n -gt {fails} ] || {{ sleep 0.3; exit 1; }}; {reg} exec sleep 60"
)


class JoiningStore(MemoryStore):
    """Ray's node table as the GCS keeps it: rank 1 is listed once its raylet has started (the stand-in's mark)."""

    def __init__(self, mark):
        super().__init__()
        self.mark = mark

    def nodes(self, timeout: float = 2.0) -> dict[int, dict]:
        if self.mark.exists() and 1 not in self.table:
            self.join(1, "10.0.0.2")
        return super().nodes(timeout)


QUICK, SLOW = 60.0, 0.0  # `slow_after`: every failed try exits sooner than it (quick), or later (slow)


# `within`: --timeout, short where the case ends by it, long enough elsewhere for a loaded machine
@pytest.mark.parametrize(
    "fails, registers, slow_after, within, tries, error",
    [
        (0, True, QUICK, 30, 1, None),
        (2, True, QUICK, 30, 3, None),
        (3, True, QUICK, 30, 3, "did not join 10.0.0.1:6379 in 3 tries: `ray start` exited with code 1 before"),
        (5, True, SLOW, 30, 6, None),  # slow tries are not counted, only timed
        # --timeout ends it: after a try exited, or during one
        (999, True, SLOW, 4, None, r"tries within --timeout: `ray start` exited|did not register with the GCS in time"),
        (0, False, QUICK, 4, 1, "rank 1's Ray node did not register with the GCS in time"),  # --timeout bounds the wait
    ],
)
def test_a_start_that_exits_before_the_node_registers_is_tried_again(
    monkeypatch, tmp_path, capsys, fails, registers, slow_after, within, tries, error
):
    start = START.format(d=tmp_path, fails=fails, reg=f"touch {tmp_path}/registered;" if registers else "")
    monkeypatch.setattr(Plan, "worker_start_command", lambda self, env: ["bash", "-c", start])
    plan = Plan(NodeSpec("dstack", 1, 2, "10.0.0.2", head_address="10.0.0.1"), ["true"], {}, temp_dir=str(tmp_path))
    store = JoiningStore(tmp_path / "registered")
    deadline = time.monotonic() + within
    if error is None:
        proc = lifecycle.start_worker_ray(plan, store, {}, {}, deadline, slow_after)
        assert proc.poll() is None and store.nodes()[1]["alive"]
        lifecycle.stop_ray(proc)
    else:
        with pytest.raises(RigError, match=error):
            lifecycle.start_worker_ray(plan, store, {}, {}, deadline, slow_after)
    made = int((tmp_path / "tries").read_text())
    assert made == tries if tries is not None else made > 3
    said = capsys.readouterr().err
    again = range(2, made + 2)  # each try but the first is announced, and no try past the last
    assert [f"starting it again (try {n})" in said for n in again] == [n <= made for n in again]
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


class HeadStore(JoiningStore):
    """The head's own GCS: rank 0 is listed once its raylet has started."""

    def nodes(self, timeout: float = 2.0) -> dict[int, dict]:
        if self.mark.exists() and 0 not in self.table:
            self.join(0, "10.0.0.1")
        return MemoryStore.nodes(self, timeout)


@pytest.mark.parametrize(
    "fails, nnodes, slow_after, tries, error",
    [
        (0, 1, QUICK, 1, None),
        (2, 1, SLOW, 3, None),  # one node: a slow start is started again, as a worker's is
        (1, 1, QUICK, 1, r"head: `ray start` exited with code 1"),  # a quick failure is Ray's answer: not again
        # several nodes: started once (its workers may be joining that GCS), the start's exit left to the head's watch
        (1, 2, SLOW, 1, None),
    ],
)
def test_a_single_nodes_head_whose_start_exits_slow_is_started_again(
    tmp_path, capsys, fails, nnodes, slow_after, tries, error
):
    start = START.format(d=tmp_path, fails=fails, reg=f"touch {tmp_path}/registered;")
    spec = NodeSpec("dstack", 0, nnodes, "10.0.0.1", head_address="10.0.0.1")
    plan = Plan(spec, ["true"], {}, temp_dir=str(tmp_path), start_command=["bash", "-c", start])
    store = HeadStore(tmp_path / "registered")
    deadline = time.monotonic() + 30
    if error is None:
        proc, got, _ = lifecycle.start_head_ray(plan, deadline, slow_after, lambda address: store)
        assert got is store
        while not (tmp_path / "tries").exists():  # several nodes: returned once the GCS answered, before its start ran
            time.sleep(0.05)
        lifecycle.stop_ray(proc)
    else:
        with pytest.raises(RigError, match=error):
            lifecycle.start_head_ray(plan, deadline, slow_after, lambda address: store)
    assert int((tmp_path / "tries").read_text()) == tries
    said = capsys.readouterr().err
    assert [f"starting it again (try {n})" in said for n in range(2, tries + 2)] == [
        n <= tries for n in range(2, tries + 2)
    ]
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
