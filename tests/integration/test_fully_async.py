"""verl's fully async mode (async_training.*) for real on one node: a rollout worker streaming prompt groups into the
queue, a training worker taking an update's worth at a time, the weights crossing over Gloo every
trigger_parameter_sync_step updates. Stopped by SIGTERM with generations in flight and resumed: every prompt drawn is
trained once or still pending, and the pending ones are generated first."""

import pytest

from rlrig.trainer.data.sampler import Sampler
from rlrig.trainer.driver import checkpoint
from tests.integration.test_rollout_pool import POOL, stopped_by_sigterm
from tests.integration.test_train import metrics, rlrig

pytestmark = pytest.mark.integration
REQUIRED = 8  # TINY's ppo_mini_batch_size x async_training.require_batches
PROMPTS = 2048  # the embedded data set's training prompts
FULLY_ASYNC = [
    *POOL,
    "data.train_batch_size=0",
    "async_training.staleness_threshold=0.5",
    "async_training.trigger_parameter_sync_step=2",
    "rollout.total_rollout_steps=2000",
    "rollout.test_freq=0",
]


def accounted(ts: dict) -> None:
    """Every prompt drawn so far is trained (updates x REQUIRED of them) or pending, once."""
    pending = ts["pending"]
    assert len(set(pending)) == len(pending)
    assert ts["epoch"] * PROMPTS + ts["pos"] == ts["updates"] * REQUIRED + len(pending), ts


def test_fully_async_streams_versions_and_resumes_after_sigterm_with_every_prompt_once(tmp_path):
    run = tmp_path / "fully_async"
    args = [*FULLY_ASYNC, "trainer.save_freq=0"]
    out = stopped_by_sigterm(args, run)
    assert "rollout pool: 1 engine(s), fully_async_policy" in out and f"{PROMPTS} prompts" in out
    stopped = int((run / "latest_checkpointed_iteration.txt").read_text())
    got = metrics(run)
    # a step is a weight version of two updates; the first trains on the initial weights' samples, later ones may
    # take samples a version behind (staleness_threshold=0.5), never more
    assert [m["training/global_step"] for m in got] == list(range(1, stopped + 1))
    assert all(m["fully_async/count/updates"] == 2.0 for m in got)
    assert got[0]["training/off_policy_steps"] == 0.0 and all(m["training/off_policy_steps"] <= 1 for m in got)
    assert all(m["fully_async/count/dropped_stale_samples"] == 0 for m in got)
    assert all(m["perf/weight_sync_bytes"] > 0 for m in got)
    first = checkpoint.trainer_state(run / f"global_step_{stopped}")
    assert first["updates"] == 2 * stopped
    accounted(first)

    more = [f"trainer.total_training_steps={stopped + 2}", "trainer.save_freq=1", f"trainer.default_local_dir={run}"]
    r = rlrig("train", *args, *more)
    assert r.returncode == 0 and f"at step {stopped}" in r.stderr, r.stderr[-3000:]
    got = metrics(run)
    assert [m["training/global_step"] for m in got] == list(range(1, stopped + 3))
    last = checkpoint.trainer_state(run / f"global_step_{stopped + 2}")
    assert last["updates"] == 2 * (stopped + 2)
    accounted(last)
    # the pending prompts went first: none of them is pending still, and the draw went on where it stood
    assert not set(first["pending"]) & set(last["pending"])
    order = Sampler(PROMPTS, 1, 1, True).order()  # the embedded data set, data.seed=1
    assert set(last["pending"]) <= set(order[: last["pos"]])


def test_proximal_log_probs_come_from_the_weights_each_version_started_with(tmp_path):
    """compute_prox_log_prob: every update of a version takes its old log-probs from the weights the version began
    with, swapped in for the pass. In the first version those are the weights that generated every sample, so the
    importance weights against the engine's log-probs are exactly 1 at all three updates, though the actor moved
    after the first; later versions train samples from older weights, and the weights move off 1."""
    run = tmp_path / "prox"
    extra = ["async_training.trigger_parameter_sync_step=3", "async_training.compute_prox_log_prob=True"]
    extra += ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=2.0"]
    r = rlrig("train", *FULLY_ASYNC, *extra, "trainer.total_training_steps=3", f"trainer.default_local_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    got = metrics(run)
    assert [m["fully_async/count/updates"] for m in got] == [3.0, 3.0, 3.0]
    first = got[0]
    assert first["rollout_corr/rollout_is_min"] == pytest.approx(1.0) == first["rollout_corr/rollout_is_max"]
    assert first["actor/ppo_kl"] != 0.0  # the actor did move within the version
    assert any(m["rollout_corr/rollout_is_max"] > 1.0 + 1e-3 for m in got[1:])
