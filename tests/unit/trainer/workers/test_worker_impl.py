"""trainer.use_legacy_worker_impl through a real step: verl's legacy workers (auto, enable) weigh each micro batch's
mean loss by its share of the mini batch's rows; its engine workers (disable) weigh every token of the mini batch
alike, whatever micro batch it falls in (core_algos.global_agg_loss), and leave the critic's micro batch means
unscaled. The first optimizer step's gradients of the actor and of the critic tell which was done."""

import pytest
import torch

from rlrig.trainer.config.presets import EMBEDDED
from rlrig.trainer.workers.step.request import StepRequest

pytestmark = pytest.mark.process


def _first_gradients(impl: str, micro: int) -> tuple[dict[str, torch.Tensor], dict]:
    from rlrig.trainer.driver.single_process import single_worker

    overrides = [
        *EMBEDDED,
        "actor_rollout_ref.rollout.name=hf",
        "algorithm.adv_estimator=gae",  # a critic too
        f"trainer.use_legacy_worker_impl={impl}",
        # 32 prompts x 8 samples on one worker, mini batches of 16 x 8 = 128 rows
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"critic.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.optim.clip_grad=1e9",  # no clipping: gradients compared as computed
        "critic.optim.clip_grad=1e9",
    ]
    grads: dict[str, torch.Tensor] = {}
    with single_worker(overrides) as (w, batches):
        for role in ("actor", "critic"):
            t = getattr(w.models, role)
            step = t.opt.step

            def first(*a, _role=role, _t=t, _step=step, **k):
                if _role not in grads:
                    grads[_role] = torch.cat([p.grad.flatten() for p in _t.module.parameters() if p.grad is not None])
                return _step(*a, **k)

            t.opt.step = first
        out = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.001))
    return grads, out


@pytest.fixture(scope="module")
def runs():
    return {(impl, micro): _first_gradients(impl, micro) for impl in ("auto", "disable") for micro in (32, 128)}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-6 * a.abs().max().item())


def test_engine_workers_weigh_tokens_alike_whatever_the_micro_batches(runs):
    # one micro batch per mini batch: both implementations take the mini batch's token mean
    assert close(runs["auto", 128][0]["actor"], runs["disable", 128][0]["actor"])
    # four: the engine's gradient is still the mini batch's token mean, the legacy workers' a mean of micro means
    assert close(runs["disable", 32][0]["actor"], runs["disable", 128][0]["actor"])
    assert not close(runs["auto", 32][0]["actor"], runs["disable", 32][0]["actor"])
    # the loss reported is the mini batch's as well (verl: summed over the micro batches)
    assert runs["disable", 32][1]["actor/pg_loss"] == pytest.approx(runs["disable", 128][1]["actor/pg_loss"], rel=1e-4)


def test_engine_workers_leave_the_critics_micro_batch_means_unscaled(runs):
    # verl's engine backpropagates each of the 4 micro batches' token mean as it is; the legacy critic weighs each by
    # its share, 1/4 of the mini batch's rows
    assert close(runs["disable", 32][0]["critic"], 4 * runs["auto", 32][0]["critic"])
    assert close(runs["disable", 128][0]["critic"], runs["auto", 128][0]["critic"])
