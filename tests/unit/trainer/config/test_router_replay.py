"""MoE routing replay's keys (verl's actor.router_replay.mode, rollout.enable_rollout_routing_replay): what verl's
own checks refuse is refused in one line with verl's words, and what rlrig does not build is refused naming it; the
model and the engine are asked at start-up (workers/start_checks.moe_check)."""

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.config.validation import validate
from rlrig.trainer.errors import ConfigError

MODE = "actor_rollout_ref.actor.router_replay.mode"
RECORD = "actor_rollout_ref.rollout.enable_rollout_routing_replay"


def _error(*keys: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate(parse_overrides(list(keys)))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_modes_and_their_pairings_as_verl_checks_them():
    assert "choose one of disabled, R2, R3" in _error(f"{MODE}=R1")
    assert "R2 requires algorithm.rollout_correction.bypass_mode=False" in _error(
        f"{MODE}=R2", "algorithm.rollout_correction.bypass_mode=True", "actor_rollout_ref.rollout.name=vllm"
    )
    assert "cannot be enabled simultaneously" in _error(f"{MODE}=R2", f"{RECORD}=True")
    pool = ["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"]
    fully_async = [*pool, "data.train_batch_size=0", "async_training.staleness_threshold=0.5"]
    fully_async += ["trainer.async_mode=fully_async_policy", "async_training.use_rollout_log_probs=True"]
    assert "which async_training.use_rollout_log_probs=True skips" in _error(f"{MODE}=R2", *fully_async)
    assert f"which {RECORD}=True records; set it" in _error(f"{MODE}=R3")
    for ok in ([f"{MODE}=R2"], [f"{MODE}=R3", f"{RECORD}=True"], [f"{RECORD}=True"], []):
        validate(parse_overrides(ok))


def test_what_rlrig_does_not_build_is_refused():
    sp = ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "actor_rollout_ref.model.use_remove_padding=True"]
    sp += ["trainer.n_gpus_per_node=2"]
    assert "under sequence parallelism is not in rlrig" in _error(f"{MODE}=R2", *sp)
    assert "shared prompts" in _error(f"{MODE}=R2", "actor_rollout_ref.actor.use_prefix_grouper=True")
    assert "record_file" in _error("actor_rollout_ref.actor.router_replay.record_file=/tmp/r.pt")
    assert "reference routes as its own router does" in _error("actor_rollout_ref.ref.router_replay.mode=R3")


def test_the_model_and_the_engine_are_asked_at_start_up():
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.workers.start_checks import moe_check
    from tests.helpers import tiny_moe

    moe_path, dense = tiny_moe.ensure("mixtral"), ensure_tiny_model()

    def check(path, engine, device, *keys):
        return moe_check(parse_overrides([f"actor_rollout_ref.model.path={path}", *keys]), path, engine, device)

    assert "has no mixture-of-experts routers" in check(dense, "hf", "cpu", f"{MODE}=R2")
    assert check(moe_path, "hf", "cpu", f"{MODE}=R2") is None
    assert "the hf engine does not return" in check(moe_path, "hf", "cpu", f"{MODE}=R3", f"{RECORD}=True")
    assert "Model Runner V2, which needs Triton" in check(moe_path, "vllm", "cpu", f"{MODE}=R3", f"{RECORD}=True")
    assert check(moe_path, "vllm", "cuda", f"{MODE}=R3", f"{RECORD}=True") is None
    rollout = "actor_rollout_ref.rollout."
    no_cache = check(moe_path, "vllm", "cuda", f"{RECORD}=True", f"{rollout}enable_prefix_caching=False")
    assert "only with prefix caching" in no_cache
    tp2 = check(
        moe_path,
        "vllm",
        "cuda",
        f"{RECORD}=True",
        f"{rollout}name=vllm",
        f"{rollout}tensor_model_parallel_size=2",
        "trainer.n_gpus_per_node=2",
    )
    assert "from one engine process only" in tp2 and "\n" not in tp2
    assert check(moe_path, "sglang", "cuda", f"{RECORD}=True") is None
