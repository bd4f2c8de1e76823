"""verl's torch profiler through `rlrig train` on two CPU workers: the chosen rank writes one chrome trace for the
window of steps, and no other rank or step writes one (about 30 s)."""

import gzip
import json
import os
import subprocess
import sys

import pytest

from rlrig.entrypoint.cluster.ports import kernel_free_port

pytestmark = pytest.mark.integration


# long: CI checks the chosen rank, window and schedule in the process tier (tests/unit/trainer/workers)
@pytest.mark.long
def test_the_chosen_rank_writes_one_trace_for_its_window_of_steps(tmp_path):
    prof = tmp_path / "profile"
    args = [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.max_response_length=8",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=3",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2,3]",
        "global_profiler.profile_continuous_steps=True",
        f"global_profiler.save_path={prof}",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.ranks=[1]",
    ]
    env = {**os.environ, "RLRIG_RAY_PORT": str(kernel_free_port())}  # beside any other run's head on this machine
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(str(p.relative_to(prof)) for p in prof.rglob("*") if p.is_file()) == ["e2e/step2_prof_rank-1.json.gz"]
    with gzip.open(prof / "e2e/step2_prof_rank-1.json.gz") as f:
        events = json.load(f)["traceEvents"]
    phases = [e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"] == "update_actor"]
    assert len(phases) == 2  # steps 2 and 3 in the one trace
    assert sum(e.get("cat") == "cpu_op" for e in events) > 100


# long: the process tier checks the rollout profiler in one worker (tests/unit/trainer/workers/test_rollout_profiler.py)
@pytest.mark.long
def test_the_rollout_profiler_records_its_rank_and_leaves_the_actors_rank_as_it_was(tmp_path):
    prof = tmp_path / "profile"
    args = [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "data.max_response_length=8",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={prof}",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.ranks=[1]",
        "actor_rollout_ref.rollout.profiler.enable=True",
        "actor_rollout_ref.rollout.profiler.ranks=[0]",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
    ]
    env = {**os.environ, "RLRIG_RAY_PORT": str(kernel_free_port())}
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(str(p.relative_to(prof)) for p in prof.rglob("*") if p.is_file()) == [
        "agent_loop_rollout_replica_0/step2_prof_rank-0.json.gz",
        "e2e/step2_prof_rank-1.json.gz",
    ]
    with gzip.open(prof / "e2e/step2_prof_rank-1.json.gz") as f:
        marks = {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"}
    assert {"gen", "update_actor"} <= marks  # rank 1's engine is not recorded: its window holds its generation
    with gzip.open(prof / "agent_loop_rollout_replica_0/step2_prof_rank-0.json.gz") as f:
        assert sum(e.get("cat") == "cpu_op" for e in json.load(f)["traceEvents"]) > 100
