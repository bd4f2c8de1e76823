"""An MoE actor's training step on CPU (tiny random Qwen3-MoE, hf engine): the model's auxiliary load-balancing loss
joins the actor's loss where its config asks for it (override_config.output_router_logits), and verl's expert-load
metrics come every rollout.moe_load_balance_metrics_interval steps."""

import pytest
import torch

from rlrig.trainer.workers import ppo_update
from rlrig.trainer.workers.step.request import StepRequest
from tests.helpers import tiny_moe

pytestmark = pytest.mark.process

BASE = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.model.use_remove_padding=True",
    "data.max_response_length=8",
]


def _steps(extra: list[str], n: int, monkeypatch=None) -> list[dict]:
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    torch.manual_seed(0)
    path = tiny_moe.ensure("qwen3_moe")
    with single_worker([*EMBEDDED, *BASE, f"actor_rollout_ref.model.path={path}", *extra]) as (w, batches):
        return [w.step(StepRequest(next(batches), global_step=s, kl_coef=0.001)) for s in range(1, n + 1)]


def test_the_aux_loss_joins_the_actors_loss_and_the_load_metrics_come_at_the_interval(monkeypatch):
    added = []
    real = ppo_update.moe_aux_loss

    def spy(forward, mini, weight):
        term = real(forward, mini, weight)
        added.append((forward.tap.spec.aux_coef, float(term.detach()) if torch.is_tensor(term) else term))
        return term

    monkeypatch.setattr(ppo_update, "moe_aux_loss", spy)
    on = [
        "+actor_rollout_ref.model.override_config.output_router_logits=True",
        "+actor_rollout_ref.model.override_config.router_aux_loss_coef=0.5",
        "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=2",
    ]
    first, second = _steps(on, 2)
    assert added and all(coef == 0.5 and term > 0 for coef, term in added)
    assert first["actor/moe_aux_loss"] == pytest.approx(added[0][1] / 0.5, rel=1e-5)  # one micro batch a step
    assert not any(k.startswith("actor/moe/") for k in first)  # the interval: every second step
    for name in ("max_vio", "min_vio", "avg_vio", "router_entropy"):
        assert f"actor/moe/{name}/layer_1" in second and f"actor/moe/{name}/avg" in second
    assert second["actor/moe/max_vio/max"] >= 0 >= second["actor/moe/min_vio/layer_0"]


def test_without_the_config_asking_no_aux_loss_and_no_load_metrics():
    (out,) = _steps([], 1)
    assert "actor/moe_aux_loss" not in out and not any(k.startswith("actor/moe/") for k in out)
