"""Restart in place on real parts: two namespace nodes training with --max-restarts 1; the worker node's processes
killed with SIGKILL mid-run and its `rlrig train` started again (what its launcher would do) -> the head restarts
the trainer, which resumes from its last checkpoint; the run ends with every step once and both nodes exit 0."""

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from rlrig.trainer.driver import checkpoint
from tests.helpers.cluster import TWO_NODE_TRAIN, dstack_env
from tests.helpers.crashlog import excerpt

pytestmark = pytest.mark.integration
STEPS = 6
PROMPTS = 2048  # the embedded data set's training prompts
TRAIN = [
    "train",
    "--max-restarts",
    "1",
    "--rejoin-timeout",
    "120",
    *TWO_NODE_TRAIN,
    f"trainer.total_training_steps={STEPS}",
]


def logged(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kill_node(proc: psutil.Process) -> None:
    """SIGKILL to the node's rlrig and everything below it (Ray's daemons and workers): a node lost, not stopped."""
    tree = [proc, *proc.children(recursive=True)]
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=20)


# the rollout on a pool of its own (one node each), one step off-policy and fully async; long: CI keeps the colocated
# case here and each mode's SIGTERM resume (test_rollout_pool, test_fully_async), which take the same resume path
POOL = [
    "trainer.nnodes=1",
    "actor_rollout_ref.hybrid_engine=False",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.name=hf",
]
MODES = {
    "colocated": [],
    "one-step": [*POOL, "trainer.async_mode=one_step_off_policy"],
    "fully-async": [
        *POOL,
        "data.train_batch_size=0",
        "async_training.require_batches=1",
        "async_training.trigger_parameter_sync_step=1",
        "async_training.staleness_threshold=0.5",
        "rollout.total_rollout_steps=2000",
        "rollout.test_freq=0",
    ],
}


@pytest.mark.parametrize(
    "mode",
    ["colocated", *(pytest.param(m, marks=pytest.mark.long) for m in ("one-step", "fully-async"))],
)
def test_a_killed_worker_started_again_rejoins_and_the_run_completes(cluster_hosts, tmp_path, mode):
    ns = cluster_hosts(2)
    run = tmp_path / "run"
    args = [*TRAIN, *MODES[mode], f"trainer.default_local_dir={run}"]
    start = lambda i: cluster_hosts.start(ns, i, {**dstack_env(ns, i, "rcv"), "HOME": str(Path.home())}, args)
    head, worker = start(0), start(1)
    deadline = time.monotonic() + 400
    while len(logged(run)) < 3:  # past the step-2 checkpoint, in the middle of the run
        assert time.monotonic() < deadline and head.proc.poll() is None, head.output[-3000:]
        time.sleep(0.2)
    kill_node(psutil.Process(worker.proc.pid))
    head.wait_for("restart 1/1: lost node rank 1", 60)
    again = start(1)
    assert head.wait(600) == 0, excerpt(head.output, 4000)
    assert again.wait(120) == 0, again.output[-3000:]
    out = head.output
    assert "restart 1/1: all 2 node(s) back" in out and "resumed from" in out, out[-4000:]
    rows = logged(run)
    assert [m["training/global_step"] for m in rows] == list(range(1, STEPS + 1)), out[-3000:]
    resumed_at = int(out.split("resumed from")[1].split("at step ")[1].split()[0].rstrip(";"))
    assert resumed_at >= 2
    assert [m["training/restarts"] for m in rows] == [0] * resumed_at + [1] * (STEPS - resumed_at)
    # the fabric check before each run: its report kept with the run
    assert out.count("fabric check passed") == 2
    report = json.loads((run / "fabric.json").read_text())
    assert report["verdict"] == "passed" and [n["rank"] for n in report["nodes"]] == [0, 1]
    if mode == "fully-async":  # every prompt drawn trained once or pending, across the restart
        state = checkpoint.trainer_state(run / f"global_step_{STEPS}")
        pending = state["pending"]
        assert state["updates"] == STEPS and len(set(pending)) == len(pending)
        assert state["epoch"] * PROMPTS + state["pos"] == STEPS * 8 + len(pending), state
