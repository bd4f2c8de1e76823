"""verl's rollout correction in a training step, on CPU: what rejection sampling (decoupled) and bypass mode change
in the worker's phases. The hf engine computes no log-probs of its own (so rlrig refuses rollout correction with
it); here it stands in for vLLM with log-probs of its own made up as the actor's plus noise, and the refusal is
lifted for the test."""

import pytest
import torch

from rlrig.trainer.algos.rollout_correction import rejection_mask
from rlrig.trainer.config import validation
from rlrig.trainer.config.presets import EMBEDDED
from rlrig.trainer.model.forward import token_logprobs
from rlrig.trainer.workers import ppo_update
from rlrig.trainer.workers.step import sources
from rlrig.trainer.workers.step.request import StepRequest

pytestmark = pytest.mark.process

SMALL = [  # 8 prompts x 4 samples on one worker
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.use_kl_loss=False",
]
TWO_MINI_BATCHES = "actor_rollout_ref.actor.ppo_mini_batch_size=4"
ONE_MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size=8"


def _step(monkeypatch, extra: list[str]) -> tuple[dict, dict]:
    """One step; returns its metrics and what the actor's update received: the batch, and each bypass-loss call's
    (old log-probs, current log-probs, mask)."""
    from rlrig.trainer.driver.single_process import single_worker

    monkeypatch.setattr(validation, "rollout_is_refusal", lambda rc, engine: None)
    seen: dict = {"losses": []}

    def update_actor(t, batch, cfg, plan, *rest):
        seen["batch"] = batch
        return real_update(t, batch, cfg, plan, *rest)

    def bypass_loss(rc, allreduce):
        fn = real_bypass(rc, allreduce)

        def loss(old, logp, adv, mask, *rest):
            seen["losses"].append((old.detach().clone(), logp.detach().clone(), mask.clone()))
            return fn(old, logp, adv, mask, *rest)

        return loss

    real_update, real_bypass = sources.update_actor, ppo_update.bypass_loss
    monkeypatch.setattr(sources, "update_actor", update_actor)
    monkeypatch.setattr(ppo_update, "bypass_loss", bypass_loss)
    with single_worker([*EMBEDDED, "actor_rollout_ref.rollout.name=hf", *SMALL, *extra]) as (w, batches):
        generate, g = w.engine.generate, torch.Generator().manual_seed(0)

        def with_logprobs(prompts, n, *args, **kwargs):
            ro = generate(prompts, n, *args, **kwargs)
            with torch.no_grad():
                actor = token_logprobs(w.models.actor.module, ro.input_ids, ro.attention_mask, ro.prompt_len)[0]
            ro.engine_logp = (actor + 0.3 * torch.randn(actor.shape, generator=g)) * ro.response_mask
            return ro

        w.engine.generate = with_logprobs
        out = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.001))
    return out, seen


def _sampled(batch) -> torch.Tensor:
    return batch.attention_mask[:, batch.prompt_len :]


def test_decoupled_rejection_takes_tokens_out_of_the_advantages_and_losses(monkeypatch):
    """verl's compute_rollout_correction_and_add_to_batch: after the old-log-prob pass, before the advantages, the
    response mask loses what rejection sampling rejects; the response lengths are the engine's still."""
    rc = "algorithm.rollout_correction"
    keys = [f"{rc}.rollout_rs=token_k1", f"{rc}.rollout_rs_threshold=0.8_1.25", ONE_MINI_BATCH]
    out, seen = _step(monkeypatch, keys)  # one mini batch: the pass still runs (rollout_rs)
    b = seen["batch"]
    assert b.old_logp is not None and "timing_s/old_log_prob" in out
    kept, metrics = rejection_mask(b.old_logp, b.engine_logp, _sampled(b), "token_k1", "0.8_1.25")
    torch.testing.assert_close(b.response_mask, kept)
    rejected = (_sampled(b) - kept).sum().item()
    assert 0 < rejected < _sampled(b).sum().item()
    assert torch.all(b.advantages[kept == 0] == 0)  # GRPO's advantages are masked by the new mask
    assert out["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(rejected / _sampled(b).sum().item())
    assert out["response_length/mean"] == pytest.approx(_sampled(b).sum(-1).float().mean().item())
    assert "training/rollout_probs_diff_max" in out and not seen["losses"]


def test_bypass_mode_takes_the_engines_log_probs_as_the_old_ones(monkeypatch):
    """verl's apply_bypass_mode: no old-log-prob pass, the engine's log-probs in its place; the loss rejects per
    micro batch against the current policy and leaves the batch's mask whole."""
    rc = "algorithm.rollout_correction"
    keys = [f"{rc}.bypass_mode=True", f"{rc}.loss_type=reinforce", f"{rc}.rollout_is=token"]
    keys += [f"{rc}.rollout_rs=token_k1", f"{rc}.rollout_rs_threshold=0.8_1.25", TWO_MINI_BATCHES]
    out, seen = _step(monkeypatch, keys)
    b = seen["batch"]
    assert "timing_s/old_log_prob" not in out and "training/rollout_probs_diff_max" not in out
    assert torch.equal(b.old_logp, b.engine_logp) and torch.equal(b.response_mask, _sampled(b))
    olds = torch.cat([old for old, _, _ in seen["losses"]])
    torch.testing.assert_close(olds, b.engine_logp)  # two mini batches: the engine's are the old ones
    assert 0 < out["rollout_corr/rollout_rs_token_k1_masked_fraction"] < 1
    assert out["rollout_corr/rollout_is_mean"] != pytest.approx(1.0, abs=1e-3)


def test_bypass_mode_on_policy_takes_the_updates_own_log_probs_as_verl_does(monkeypatch):
    """One epoch of one mini batch: verl's dp_actor puts the update's own log-probs in place of the old ones
    (dp_actor.py:591) in bypass mode too, so the weights are 1 and nothing is rejected."""
    rc = "algorithm.rollout_correction"
    keys = [f"{rc}.bypass_mode=True", f"{rc}.rollout_is=token", f"{rc}.rollout_rs=token_k2"]
    keys += [f"{rc}.rollout_rs_threshold=0.001", ONE_MINI_BATCH]
    out, seen = _step(monkeypatch, keys)
    assert seen["losses"] and all(torch.equal(old, logp) for old, logp, _ in seen["losses"])
    assert out["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)
    assert out["rollout_corr/rollout_rs_masked_fraction"] == 0.0
