"""rollout.expert_parallel_size as verl 0.9 passes it: vLLM's enable_expert_parallel and SGLang's ep_size, at 1 or the
engine's tensor-parallel size (verl asserts tensor_model_parallel_size * data_parallel_size, and rlrig's engines are
not data parallel, so rollout.data_parallel_size stays refused above 1)."""

import pytest

from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.rollout.engines import sglang_engine, vllm_engine


@pytest.mark.parametrize("ep, split", [(1, False), (2, True)])
def test_the_engines_split_experts_when_asked(ep, split):
    cfg = RolloutConfig(tensor_model_parallel_size=2, expert_parallel_size=ep)
    assert vllm_engine.engine_kwargs(cfg, "/m", 48, "cuda", 3).get("enable_expert_parallel", False) is split
    kw = sglang_engine.engine_kwargs(cfg, "/m", 48, 3)
    assert kw["tp_size"] == 2 and kw.get("ep_size", 1) == ep


_BASE = ["trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]


@pytest.mark.parametrize(
    "extra, refusal",
    [
        (["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.expert_parallel_size=2"], None),
        (["actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.expert_parallel_size=2"], None),
        (
            ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.expert_parallel_size=4"],
            "expert_parallel_size=4 must be 1 or equal tensor_model_parallel_size",
        ),
        (
            ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.expert_parallel_size=2"],
            "splits experts in vllm and sglang",
        ),
        (["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.data_parallel_size=2"], "data_parallel"),
    ],
)
def test_expert_parallel_size_config(extra, refusal):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    if refusal is None:
        assert parse_overrides([*_BASE, *extra]).actor_rollout_ref.rollout.expert_parallel_size == 2
        return
    with pytest.raises(ConfigError, match=refusal):
        parse_overrides([*_BASE, *extra])
