"""DAPO's dynamic sampling under `rlrig train` (colocated, two workers): groups whose samples all score alike are
dropped, more generation batches are drawn until the step's batch is full, the step trains on exactly
data.train_batch_size prompts' groups, and a step that cannot fill its batch within max_num_gen_batches stops the
run in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import shared_ray

pytestmark = pytest.mark.integration

# The embedded arithmetic rows carry their index: an even one's samples all score 1 (no signal: dropped), an odd
# one's alternate 0, 1 (the worker scores a prompt's samples one after another), so only half the prompts are kept.
REWARD = """
import itertools

_count = itertools.count()


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if extra_info["index"] % 2 == 0 or HARD:
        return 1.0
    return float(next(_count) % 2)
"""

RUN = [
    "trainer.n_gpus_per_node=2",
    "data.train_batch_size=4",
    "data.gen_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "algorithm.adv_estimator=grpo",
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.metric=acc",
    "trainer.val_before_train=False",
    "trainer.test_freq=0",
    "trainer.total_training_steps=2",
]


def rlrig(tmp_path: Path, hard: bool, *extra: str) -> subprocess.CompletedProcess:
    reward = tmp_path / "reward.py"
    reward.write_text(f"HARD = {hard}\n{REWARD}")
    own = [f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score"]
    args = ["train", *RUN, *own, f"trainer.default_local_dir={tmp_path / 'run'}", *extra]
    cmd = [sys.executable, "-m", "rlrig.entrypoint.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=shared_ray.env())


# long: CI fills the batch through vLLM (tests/vllm_tier/test_vllm_dynamic_sampling.py)
@pytest.mark.long
def test_dropped_groups_are_replaced_until_the_batch_is_full(tmp_path):
    r = rlrig(tmp_path, False, "trainer.save_freq=2")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/global_step"] for m in rows] == [1, 2]
    for m in rows:
        # about half of each generation batch is dropped, so a step takes more than one
        assert m["train/num_gen_batches"] >= 2, m
        dropped = m["training/filter_groups/evicted_samples"]
        kept = 4 + m["training/filter_groups/discarded_surplus_samples"]
        assert dropped + kept == 4 * m["train/num_gen_batches"] and dropped > 0
        # only kept groups trained: each holds one 0 and one 1, so the batch's mean score is exactly 0.5
        assert m["critic/score/mean"] == pytest.approx(0.5) and m["critic/score/max"] == 1.0
        assert m["timing_s/gen"] > 0 and "actor/pg_loss" in m
    # every prompt drawn is consumed: the checkpoint's place in the data is after all the step's generation batches
    trainer = json.loads((tmp_path / "run" / "global_step_2" / "trainer.json").read_text())
    assert (trainer["epoch"], trainer["pos"]) == (0, 4 * sum(m["train/num_gen_batches"] for m in rows))
    # resumed, the next step draws on from there
    r = rlrig(tmp_path, False, "trainer.save_freq=1", "trainer.total_training_steps=3")
    assert r.returncode == 0 and "resumed from" in r.stderr, r.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/global_step"] for m in rows] == [1, 2, 3]
    trainer = json.loads((tmp_path / "run" / "global_step_3" / "trainer.json").read_text())
    assert (trainer["epoch"], trainer["pos"]) == (0, 4 * sum(m["train/num_gen_batches"] for m in rows))


# long: CI checks verl's line in one process (tests/unit/trainer/driver/test_dynamic_sampling.py) and a failure
# inside a step ending `rlrig train` in one line with exit 2 (tests/integration/test_mcp_tools.py)
@pytest.mark.long
def test_a_step_past_max_num_gen_batches_stops_the_run_in_one_line(tmp_path):
    r = rlrig(tmp_path, True, "algorithm.filter_groups.max_num_gen_batches=2")
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("rlrig: error:")]
    assert errors == [
        "rlrig: error: num_gen_batches=2 >= max_num_gen_batches=2. Generated too many. Please check if your data "
        "are too difficult. You could also try set max_num_gen_batches=0 to enable endless trials."
    ], r.stderr[-3000:]
    assert "Traceback" not in r.stderr
