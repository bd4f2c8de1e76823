"""Rollout on a pool of its own (actor_rollout_ref.hybrid_engine=False) for real on one node: a rollout worker and a
training worker, one CPU each, the weights crossing between them over Gloo after every step. Synchronous, every batch
on-policy, validated on the pool, and its batch shared by sample over two training workers; one step off-policy, every
batch but the first a step behind, stopped by SIGTERM with a batch in flight and resumed, every prompt trained once."""

import os
import signal
import subprocess
import sys
import time

import pytest

from rlrig.trainer.driver import checkpoint
from tests.helpers import shared_ray
from tests.integration.test_train import TINY, metrics, rlrig

pytestmark = pytest.mark.integration
POOL = [
    *TINY,
    "actor_rollout_ref.hybrid_engine=False",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=1",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.name=hf",
]
BATCH = 8  # TINY's data.train_batch_size


def stopped_by_sigterm(args: list[str], run) -> str:
    """`rlrig train` (40 steps) stopped by SIGTERM once three steps are logged: its exit 143 checked, its output."""
    p = subprocess.Popen(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", "--grace-period", "60", *args]
        + ["trainer.total_training_steps=40", f"trainer.default_local_dir={run}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=shared_ray.env(),
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= 3):
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, out[-3000:]
    return out


def test_one_step_off_policy_is_a_step_behind_and_resumes_after_sigterm_with_every_prompt_once(tmp_path):
    run = tmp_path / "one_step"
    args = [*POOL, "trainer.async_mode=one_step_off_policy", "trainer.save_freq=0", "trainer.test_freq=0"]
    stopped_by_sigterm(args, run)
    stopped = int((run / "latest_checkpointed_iteration.txt").read_text())
    got = metrics(run)
    assert [m["training/global_step"] for m in got] == list(range(1, stopped + 1))
    assert [m["training/off_policy_steps"] for m in got] == [0.0] + [1.0] * (stopped - 1)
    # the batch in flight (step stopped + 1, drawn and generating) is not in the checkpoint: it is drawn again
    ts = checkpoint.trainer_state(run / f"global_step_{stopped}")
    assert (ts["epoch"], ts["pos"]) == (0, stopped * BATCH), ts
    more = [f"trainer.total_training_steps={stopped + 2}", "trainer.save_freq=1", f"trainer.default_local_dir={run}"]
    r = rlrig("train", *args, *more)
    assert r.returncode == 0 and f"at step {stopped}" in r.stderr, r.stderr[-3000:]
    got = metrics(run)
    assert [m["training/global_step"] for m in got] == list(range(1, stopped + 3))
    # after the resume the first batch is generated with the resumed weights, the next a step behind again
    assert [m["training/off_policy_steps"] for m in got[stopped:]] == [0.0, 1.0]
    ts = checkpoint.trainer_state(run / f"global_step_{stopped + 2}")
    assert (ts["epoch"], ts["pos"]) == (0, (stopped + 2) * BATCH), ts


# long: CI keeps a hang named and the run ended by the watchdog in test_watchdog (a training worker's)
@pytest.mark.long
def test_a_rollout_worker_that_hangs_is_named_by_the_watchdog(tmp_path):
    """The rollout pool's workers report their phases as the training ranks do: one hanging in generation (the batch
    of step 3, started while step 2 trained) ends the run with exit 5 naming it, not a trainer waiting forever."""
    run = tmp_path / "hang"
    args = [*POOL, "trainer.async_mode=one_step_off_policy", "trainer.watchdog_min_s=5", "trainer.save_freq=0"]
    args += ["trainer.test_freq=0"]  # step 2 then trains and is logged while the batch of step 3 hangs
    r = rlrig(
        "train",
        *args,
        "trainer.total_training_steps=5",
        f"trainer.default_local_dir={run}",
        env={**os.environ, "RLRIG_FAULT_HANG": "0:rollout_gen:3"},
        own_cluster=True,  # the fault is read by the workers, from the environment their cluster gives them
        timeout=300,
    )
    assert r.returncode == 5, r.stderr[-3000:]
    said = r.stderr
    assert "hang: rollout 0 on node" in said and "did not finish rollout_gen at step 3" in said, said[-3000:]
    assert [m["training/global_step"] for m in metrics(run)] == [1, 2]


def test_synchronous_on_a_pool_trains_on_policy_validates_there_and_shares_its_batch_by_sample(tmp_path):
    reward = tmp_path / "reward.py"  # scores that differ within every group, so each group's statistics count
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(sum(map(ord, solution_str)) % 5)\n"
    )
    # 3 prompts x 8 samples a step
    batch = ["data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3"]
    batch += [f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score"]
    # verl's engine workers' loss: each token weighs 1 / (the mini batch's tokens over every worker), so one worker
    # and two compute the same gradient whatever their token counts (verl's legacy workers average each worker's
    # own token mean, which equals it only where the workers hold as many tokens)
    batch += ["trainer.use_legacy_worker_impl=disable"]
    pool = [o for o in POOL if not o.startswith("trainer.n_gpus_per_node=")]

    run = tmp_path / "sync"
    r = rlrig(
        "train",
        *POOL,
        *batch,
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        f"trainer.default_local_dir={run}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rollout pool: 1 engine(s), sync" in r.stderr and "rollout on " in r.stderr, r.stderr[-3000:]
    got = metrics(run)
    assert [m["training/off_policy_steps"] for m in got] == [0.0, 0.0]
    assert all(m["perf/weight_sync_bytes"] > 0 for m in got)  # pushed before each batch: the engine had the old
    # and what landed in the engine's parameters is the trainer's weights: its log-probs of its samples are the
    # trainer's, after an update too
    assert all(m["training/rollout_probs_diff_max"] < 1e-5 for m in got), [
        m["training/rollout_probs_diff_max"] for m in got
    ]
    assert any(k.startswith("val-core/") for k in got[-1]), got[-1].keys()  # trainer.test_freq=2, on the pool

    # the same first step over 2 training workers, 12 samples each (verl's dispatch): prompt 1's samples on both.
    # On the same samples (the first step's, from the same initial weights) GRPO's advantages are the same: each
    # group's statistics over all of its samples, wherever they sit; and the update follows them, so its loss and
    # gradient norm are the same too (each worker's part of a group alone would give other ones)
    split = tmp_path / "two_trainers"
    # a worker a CPU on this machine's 2 cores: the trainer's driver on a Ray of its own, which it sizes
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.trainer.driver.main", "--", "ray_kwargs.ray_init.num_cpus=3", *pool, *batch]
        + ["trainer.n_gpus_per_node=2", "trainer.total_training_steps=1", "trainer.test_freq=0"]
        + ["trainer.save_freq=0", f"trainer.default_local_dir={split}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    one, two = got[0], metrics(split)[0]
    assert two["critic/score/mean"] == pytest.approx(one["critic/score/mean"])  # the same samples
    assert two["actor/grad_norm"] == pytest.approx(one["actor/grad_norm"], rel=1e-4)
    assert two["actor/pg_loss"] == pytest.approx(one["actor/pg_loss"], abs=1e-6)
