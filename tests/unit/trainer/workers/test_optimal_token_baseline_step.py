"""One CPU step with algorithm.adv_estimator=optimal_token_baseline: the old-log-prob pass runs (also where the
update's first forward would stand in for it) and yields sum_pi_squared; the advantages and verl's variance_proxy/*
metrics come out finite."""

import math

import pytest

from rlrig.trainer.workers.step import phases
from tests.unit.trainer.workers.test_trainer_passes import _one_step

pytestmark = pytest.mark.process

PROXY = ("proxy1_signal_strength", "proxy2_total_power", "proxy3_pure_noise", "expected_a_squared", "expected_w")


def _capture_advantages(monkeypatch):
    """The batch as the advantages phase returns it."""
    seen = {}
    advantages = phases.advantages

    def spy(ctx, step):
        step = advantages(ctx, step)
        seen["batch"] = step.batch
        return step

    monkeypatch.setattr(phases, "advantages", spy)
    return lambda w: seen


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "grpo"])
def test_a_step_with_sum_pi_squared(estimator, monkeypatch):
    extra = [f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"]
    out, changed, seen = _one_step(extra, _capture_advantages(monkeypatch))
    b = seen["batch"]
    assert changed and "timing_s/old_log_prob" in out
    assert b.old_logp is not None and b.sum_pi_squared is not None and b.sum_pi_squared.shape == b.response_mask.shape
    spp = b.sum_pi_squared[b.response_mask.bool()]
    assert ((spp > 0) & (spp <= 1 + 1e-6)).all()
    assert b.advantages.isfinite().all() and b.advantages.abs().sum() > 0
    for name in PROXY:
        assert math.isfinite(out[f"variance_proxy/{name}"]), name
    assert out["variance_proxy/proxy1_signal_strength"] == pytest.approx(out["actor/grad_norm"] ** 2)
    assert out["variance_proxy/expected_w"] > 0


def test_without_sum_pi_squared_no_variance_proxy(monkeypatch):
    out, _, seen = _one_step([], _capture_advantages(monkeypatch))
    assert seen["batch"].sum_pi_squared is None and not any(k.startswith("variance_proxy/") for k in out)
