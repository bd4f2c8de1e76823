"""The watchdog's decisions: each phase's limit by hand, when a worker's phase counts as started, which rank a hang
names, and RLRIG_FAULT_HANG's parsing and once-per-run marker. The real hangs on two namespace nodes are in
tests/integration/test_watchdog.py."""

import json
import time
from types import SimpleNamespace

import pytest

from rlrig.entrypoint.errors import HANG_EXIT as ENTRYPOINT_HANG_EXIT
from rlrig.trainer.driver import faults, stacks, watchdog
from rlrig.trainer.driver.watchdog_limits import explain, phase_limit
from rlrig.trainer.errors import ConfigError


@pytest.mark.parametrize(
    "durations, factor, floor, nccl, limit, why",
    [
        ([], 10, 5, 600, 15, "its first run: 3 x trainer.watchdog_min_s 5s"),  # 3 x floor before any run
        ([0.1, 0.3, 0.2], 10, 5, 600, 5, "max(10 x median 0.20s, 5s)"),  # fast phase: the floor
        ([2.0, 4.0, 3.0, 100.0], 10, 5, 600, 35, "max(10 x median 3.50s, 5s)"),  # median of 4: (3 + 4) / 2
        ([60.0], 10, 5, 600, 570, "actor_rollout_ref.nccl_timeout 600s - 30s"),  # 600 capped: before the collective
        ([], 10, 300, 600, 570, "actor_rollout_ref.nccl_timeout 600s - 30s"),  # 900 capped too
    ],
)
def test_phase_limits_by_hand(durations, factor, floor, nccl, limit, why):
    assert phase_limit(durations, factor, floor, nccl) == pytest.approx(limit)
    assert explain(durations, factor, floor, nccl) == why


def cfg(factor=10.0, floor=5.0, nccl=60.0):
    return SimpleNamespace(
        trainer=SimpleNamespace(watchdog_factor=factor, watchdog_min_s=floor),
        actor_rollout_ref=SimpleNamespace(nccl_timeout=nccl),
    )


def dog(tmp_path, exits=None, killed=None):
    procs = [stacks.Proc("rank 0", "n0", "10.0.0.1", 100), stacks.Proc("rank 1", "n1", "10.0.0.2", 200)]
    exits, killed = [] if exits is None else exits, [] if killed is None else killed
    return watchdog.Watchdog(cfg(), tmp_path, procs, ["rank 0", "rank 1"], lambda: killed.append(True), exits.append)


def test_calls_back_to_back_in_one_phase_and_step_are_timed_each_from_its_start(tmp_path):
    """The fully async mode's rollout workers generate call after call in rollout_gen under one step: a poll that
    never sees them idle still sees a new call by its entry count."""
    w = dog(tmp_path)
    w.record({"timing_s/rollout_gen": 0.2})
    assert w.observe({"rollout 0": ("rollout_gen", 2, 7)}, now=100.0) == []
    assert w.observe({"rollout 0": ("rollout_gen", 2, 9)}, now=104.0) == []  # calls 8 and 9 came since
    assert w.observe({"rollout 0": ("rollout_gen", 2, 9)}, now=108.0) == []  # 4 s into call 9: under the 5 s floor
    assert [o.elapsed for o in w.observe({"rollout 0": ("rollout_gen", 2, 9)}, now=109.5)] == [5.5]


def test_a_phase_is_timed_from_when_it_was_first_seen_and_idle_is_no_hang(tmp_path):
    w = dog(tmp_path)
    w.record({"timing_s/gen": 0.2, "timing_s/step": 9.0, "actor/pg_loss": 1.0})
    assert w.limits.durations == {"gen": [0.2]}  # the step's own time is no phase
    assert w.observe({"rank 0": ("gen", 2), "rank 1": ("gen", 2)}, now=100.0) == []
    assert w.observe({"rank 0": ("gen", 2), "rank 1": ("reward", 2)}, now=103.0) == []
    over = w.observe({"rank 0": ("gen", 2), "rank 1": ("reward", 2)}, now=105.5)
    # rank 0 in gen since 100 (5.5 s > the floor 5 s); rank 1 in reward since 103: not yet
    assert [(o.label, o.phase, o.step, round(o.elapsed, 1)) for o in over] == [("rank 0", "gen", 2, 5.5)]
    # the same phase name at the next step is a new phase; an idle worker is waiting for the head, not hung
    assert w.observe({"rank 0": ("gen", 3), "rank 1": ("", 0)}, now=106.0) == []
    assert w.observe({"rank 0": ("gen", 3), "rank 1": ("", 0)}, now=200.0)[0].elapsed == pytest.approx(94.0)
    # reward had no run yet: 3 x the floor
    assert w.observe({"rank 0": ("", 0), "rank 1": ("reward", 4)}, now=300.0) == []
    assert w.observe({"rank 0": ("", 0), "rank 1": ("reward", 4)}, now=314.0) == []
    assert [o.label for o in w.observe({"rank 1": ("reward", 4)}, now=315.5)] == ["rank 1"]


def test_the_board_rlrig_status_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(stacks, "dump", lambda procs, folder: {"rank 0": ASLEEP, "rank 1": IN_GLOO})
    w = dog(tmp_path)
    w.board = tmp_path / "rlrig-phases-01000000.json"
    w.observe({"rank 0": ("gen", 2), "rank 1": ("", 0)}, now=100.0)
    w.publish(now=112.25)
    board = json.loads(w.board.read_text())
    assert board["ranks"] == [
        {"label": "rank 0", "ip": "10.0.0.1", "phase": "gen", "step": 2, "seconds": 12.2},
        {"label": "rank 1", "ip": "10.0.0.2", "phase": "", "step": 0, "seconds": 0.0},
    ]
    assert abs(board["written"] - time.time()) < 5
    w.hang(w.observe({"rank 0": ("gen", 2)}, now=120.0))  # a run that ends leaves no board behind
    assert not w.board.exists()


IN_GLOO = 'Thread 1 (idle): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:2960)\n'
ASLEEP = 'Thread 1 (idle): "MainThread"\n    compute_score (my_reward.py:7)\n'


@pytest.mark.parametrize(
    "stacks_by_rank, named",
    [
        ({"rank 0": IN_GLOO, "rank 1": ASLEEP}, "rank 1"),  # rank 0 waits in a collective for rank 1
        ({"rank 0": ASLEEP, "rank 1": IN_GLOO}, "rank 0"),
        ({"rank 0": IN_GLOO, "rank 1": IN_GLOO}, "rank 0"),  # both in collectives: the longest in its phase
    ],
)
def test_a_hang_names_the_rank_the_others_wait_for_and_exits(tmp_path, monkeypatch, capsys, stacks_by_rank, named):
    monkeypatch.setattr(stacks, "dump", lambda procs, folder: stacks_by_rank)
    exits, killed = [], []
    w = dog(tmp_path, exits=exits, killed=killed)
    w.record({"timing_s/update_actor": 0.5})
    w.observe({"rank 0": ("update_actor", 3), "rank 1": ("update_actor", 3)}, now=10.0)
    over = w.observe({"rank 0": ("update_actor", 3), "rank 1": ("update_actor", 3)}, now=16.0)
    w.hang(over)
    err = capsys.readouterr().err
    ip = {"rank 0": "10.0.0.1", "rank 1": "10.0.0.2"}[named]
    other = "rank 1" if named == "rank 0" else "rank 0"
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"rlrig.train: hang: {named} on node {ip} did not finish update_actor at step 3: 6.0s, ")
    assert "past its limit of 5.0s (max(10 x median 0.50s, 5s))" in line and f"in {tmp_path / 'hang-step3'}" in line
    assert f"; {other} also in update_actor for 6s" in line
    assert f"stack of {named} on {ip}" in err and stacks_by_rank[named].splitlines()[1].strip() in err
    assert exits == [watchdog.HANG_EXIT] == [ENTRYPOINT_HANG_EXIT] and killed == [True]


@pytest.mark.parametrize(
    "text, fault",
    [
        ("", []),
        ("1:gen:3", [faults.FaultHang(1, "gen", 3)]),
        ("0:collective:2", [faults.FaultHang(0, "collective", 2)]),
        ("0:save_checkpoint:4", [faults.FaultHang(0, "save_checkpoint", 4)]),
        ("1:gen:3,1:reward:5", [faults.FaultHang(1, "gen", 3), faults.FaultHang(1, "reward", 5)]),
        ("1:gen:3,2:gen:4", ConfigError),
        ("2:gen:3", ConfigError),  # rank 2 of 2
        ("1:generate:3", ConfigError),  # no such phase: it would never fire
        ("1:gen", ConfigError),
        ("1:gen:0", ConfigError),
        ("x:gen:3", ConfigError),
        ("0:rollout_gen:3", ConfigError),  # no rollout pool
    ],
)
def test_fault_hang_parsing(text, fault):
    if fault is ConfigError:
        with pytest.raises(ConfigError, match=r"RLRIG_FAULT_HANG=.*expected RANK:PHASE:STEP"):
            faults.from_env(2, env={"RLRIG_FAULT_HANG": text})
    else:
        assert faults.from_env(2, env={"RLRIG_FAULT_HANG": text}) == fault


def test_a_rollout_fault_names_a_worker_of_the_rollout_pool():
    env = {"RLRIG_FAULT_HANG": "0:rollout_gen:3"}
    assert faults.from_env(2, 1, env=env) == [faults.FaultHang(0, "rollout_gen", 3)]
    with pytest.raises(ConfigError, match="below 1 for rollout_gen"):
        faults.from_env(2, 1, env={"RLRIG_FAULT_HANG": "1:rollout_gen:3"})


def test_a_fault_fires_once_per_run_directory(tmp_path):
    f, g = faults.FaultHang(1, "gen", 3), faults.FaultHang(0, "reward", 4)
    assert [faults.due([f, g], step, tmp_path) for step in (1, 2, 3, 4, 5)] == [[], [], [f], [g], []]
    assert faults.due([f, g], 3, tmp_path) == []  # the restarted run goes on past it


def test_a_hang_tells_the_entrypoint_which_node_hung(tmp_path, monkeypatch):
    from rlrig.entrypoint.cluster.node_failures import NodeFailures
    from tests.helpers.entrypoint_fakes import MemoryStore

    store = MemoryStore()  # the cluster's key-value store, where the entrypoint reads what the trainer put
    monkeypatch.setattr(watchdog, "report_hang", lambda hung: store.put(f"{watchdog.HANG_KEY_PREFIX}0200", hung))
    monkeypatch.setattr(stacks, "dump", lambda procs, folder: {"rank 0": IN_GLOO, "rank 1": ASLEEP})
    w = dog(tmp_path)
    w.observe({"rank 0": ("balance", 3), "rank 1": ("gen", 3)}, now=0.0)
    w.hang(w.observe({"rank 0": ("balance", 3), "rank 1": ("gen", 3)}, now=20.0))
    nodes = {0: {"ip": "10.0.0.1"}, 1: {"ip": "10.0.0.2"}}
    failures = NodeFailures()
    assert failures.hangs(store, nodes) == [(1, "rank 1 hung in gen at step 3")]
    assert failures.hangs(store, nodes) == []  # read once
