"""A colocated step whose prompts do not divide over the training workers (verl 0.9's Qwen3-Next script: 16 prompts x
16 samples on 32 GPUs) is shared by sample: each worker's engine generates an equal share of the prompts x n samples,
a prompt's samples spread over workers, and its group's advantages are computed over the whole batch."""

import json
import subprocess
import sys
from collections import Counter

import pytest

from tests.helpers import shared_ray

pytestmark = pytest.mark.integration

# each scored sample: the worker's process and the prompt's row
REWARD = """
import json
import os


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(LOG, "a") as f:
        f.write(json.dumps([os.getpid(), extra_info["index"]]) + "\\n")
    return float(len(solution_str) % 2)
"""


def test_one_prompt_is_generated_by_both_workers(tmp_path):
    log, reward = tmp_path / "scored.jsonl", tmp_path / "reward.py"
    reward.write_text(f"LOG = {str(log)!r}\n{REWARD}")
    args = [
        "trainer.n_gpus_per_node=2",
        "data.train_batch_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.rollout.n=4",
        "algorithm.adv_estimator=grpo",
        "data.max_response_length=8",
        "trainer.val_before_train=False",
        "trainer.test_freq=0",
        "trainer.total_training_steps=2",
        f"custom_reward_function.path={reward}",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=shared_ray.env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    scored = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(scored) == 8  # 2 steps x 1 prompt x 4 samples
    for step in (scored[:4], scored[4:]):  # the workers score at once, so a step's lines interleave but stay apart
        assert len({index for _, index in step}) == 1, step  # one prompt ...
        assert sorted(Counter(pid for pid, _ in step).values()) == [2, 2], step  # ... two samples on each worker
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/global_step"] for m in rows] == [1, 2]
    assert all("actor/pg_loss" in m for m in rows)
