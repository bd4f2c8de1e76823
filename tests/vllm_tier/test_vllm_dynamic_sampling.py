"""DAPO's dynamic sampling with vLLM rolling out, picked by the default `rollout.name=auto` where vLLM is installed:
the kept groups reach the update with the engine's own log-probs (gathered from several generation batches of
different prompt widths), which still match the actor's."""

import json
import subprocess
import sys

import pytest

from tests.helpers import shared_ray
from tests.integration.test_dynamic_sampling import REWARD, RUN

TOL = 1e-3  # float32 engine vs float32 actor on CPU: seen ~7e-7


def test_kept_groups_keep_the_engine_log_probs(tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(f"HARD = False\n{REWARD}")
    run = tmp_path / "run"
    own = [f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score"]
    args = ["train", *RUN, *own, f"trainer.default_local_dir={run}"]
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=shared_ray.env(),
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "rollout engine: vllm" in r.stderr + r.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/global_step"] for m in rows] == [1, 2]
    for m in rows:
        assert m["train/num_gen_batches"] >= 2 and m["training/filter_groups/evicted_samples"] > 0, m
        assert m["critic/score/mean"] == pytest.approx(0.5), m
        assert m["training/rollout_probs_diff_max"] < TOL, m
