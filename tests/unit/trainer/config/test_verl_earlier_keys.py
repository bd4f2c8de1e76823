"""Keys of verl releases before the reference (0.7.0, 0.7.1, 0.8.0, 0.9.0) and verl b178a3c's own `${...}`
defaults, which verl users still pass: each is taken at verl's default, and another value is refused in one line
naming the key and the reason (none is accepted and ignored)."""

import pytest

from rlrig.trainer.config import verl_keys
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

from .verl_keys_table.report import classify

MODEL = "actor_rollout_ref.model.path=/m"
REFUSED = "a verl key rlrig does not implement: "
_JUDGE_SAMPLING = "a generative judge's requests carry their own sampling"
_RM_ENGINE = "not in rlrig's judge or reward engines"
_SKIP = "replaying dumped rollouts is not in rlrig"
_TORCH_STEPS = "its torch profiler records whole training steps"

# (release, key, verl's default as override text, another value, what the refusal says)
AT_DEFAULT = [
    ("0.9.0", "data.continuous_token.enable", "False", "True", "Continuous Token builder"),
    ("0.9.0", "data.continuous_token.model_family", "auto", "qwen3", "Continuous Token builder"),
    ("0.8.0", "actor_rollout_ref.rollout.skip.enable", "False", "True", _SKIP),
    ("0.8.0", "actor_rollout_ref.rollout.skip.dump_dir", "'~/.verl/rollout_dump'", "/tmp/dump", _SKIP),
    ("0.8.0", "actor_rollout_ref.rollout.skip.max_dump_step", "1", "3", _SKIP),
    ("0.8.0", "actor_rollout_ref.rollout.skip.action", "cache", "repeat", _SKIP),
    (
        "0.8.0",
        "actor_rollout_ref.rollout.skip._target_",
        "verl.workers.config.SkipConfig",
        "my.SkipConfig",
        "rlrig accepts only verl's own",
    ),
    ("0.8.0", "actor_rollout_ref.actor.checkpoint.mbridge_config", "{}", "{distributed_filesystem:true}", "Megatron"),
    ("0.8.0", "critic.checkpoint.mbridge_config", "{}", "{distributed_filesystem:true}", "Megatron"),
    (
        "0.7.1",
        "reward.reward_manager._target_",
        "verl.workers.config.reward_model.RewardManagerConfig",
        "my.RewardManagerConfig",
        "rlrig accepts only verl's own",
    ),
    ("0.7.0", "actor_rollout_ref.actor.profiler.tool_config.torch.step_start", "0", "2", _TORCH_STEPS),
    ("0.7.0", "actor_rollout_ref.ref.profiler.tool_config.torch.step_end", "null", "5", _TORCH_STEPS),
    ("0.7.0", "critic.profiler.tool_config.torch.step_end", "null", "5", _TORCH_STEPS),
    (
        "0.7.0",
        "algorithm.rollout_correction.rollout_rs_threshold_lower",
        "null",
        "0.5",
        "both bounds go in algorithm.rollout_correction.rollout_rs_threshold",
    ),
    ("0.7.0", "algorithm.rollout_correction.rollout_token_veto_threshold", "null", "1e-4", "token veto"),
    *(
        ("0.9.1", f"{section}.rollout.{k}", default, other, _JUDGE_SAMPLING)
        for section in ("reward_model", "reward.reward_model")
        for k, default, other in (
            ("temperature", "1.0", "0.7"),
            ("top_k", "-1", "20"),
            ("top_p", "1", "0.9"),
            ("do_sample", "True", "False"),
            ("n", "1", "4"),
            ("ignore_eos", "False", "True"),
        )
    ),
    *(
        ("0.9.1", f"reward_model.rollout.{k}", default, other, _RM_ENGINE)
        for k, default, other in (
            ("pipeline_model_parallel_size", "1", "2"),
            ("layered_summon", "False", "True"),
            ("scheduling_policy", "fcfs", "priority"),
            ("seed", "42", "7"),
            ("multi_stage_wake_up", "False", "True"),
            ("quantization", "null", "fp8"),
            ("quantization_config_file", "null", "/q.json"),
            ("mtp", "null", "{enable:true}"),
        )
    ),
]
IDS = [f"{release}:{key}" for release, key, *_ in AT_DEFAULT]


def refusal(override: str) -> str:
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, override])
    return str(e.value)


@pytest.mark.parametrize("release,key,default,other,says", AT_DEFAULT, ids=IDS)
def test_an_earlier_release_key_is_taken_at_verl_default(release, key, default, other, says):
    parse_overrides([MODEL, f"{key}={default}"])
    assert classify(key, default.strip("'")) == "default-only"


@pytest.mark.parametrize("release,key,default,other,says", AT_DEFAULT, ids=IDS)
def test_an_earlier_release_key_at_another_value_is_refused_in_one_line(release, key, default, other, says):
    text = refusal(f"{key}={other}")
    assert text.startswith(key) and REFUSED in text and says in text and "\n" not in text, text


# verl b178a3c's and 0.7's `${...}` defaults of keys verl fills from another that rlrig reads; another value is
# refused with the key's reason
FILLED = [
    (
        "actor_rollout_ref.rollout.profiler.tool_config",
        "${oc.select:actor_rollout_ref.actor.profiler.tool_config,null}",
        "{nsys:{discrete:true}}",
        "set its keys (actor_rollout_ref.rollout.profiler.tool_config.torch.*)",
    ),
    (
        "reward_model.profiler.tool_config",
        "${oc.select:actor_rollout_ref.actor.profiler.tool_config,null}",
        "{nsys:{discrete:true}}",
        "the reward model's profiler takes the actor's tool_config",
    ),
    ("reward_manager.name", "${oc.select:reward_model.reward_manager,naive}", "dapo", "set that"),
    (
        "critic.model.tokenizer_path",
        '${oc.select:actor_rollout_ref.model.path,"~/models/deepseek-llm-7b-chat"}',
        "/tok",
        "rlrig's critic reads the actor's tokens",
    ),
    (
        "actor_rollout_ref.rollout.qat",  # verl 0.7.1's, with no Megatron fallback
        "${oc.select:actor_rollout_ref.actor.fsdp_config.qat,null}",
        "{enable:true}",
        "quantization-aware training is not in rlrig",
    ),
]


@pytest.mark.parametrize("key,text,other,says", FILLED, ids=[k for k, *_ in FILLED])
def test_verl_earlier_own_interpolation_is_taken_and_another_value_refused(key, text, other, says):
    assert verl_keys.filled_by_verl(key, text) and classify(key, text) == "interpolated"
    parse_overrides([MODEL, f"{key}='{text}'"])
    refused = refusal(f"{key}={other}")
    assert refused.startswith(key) and REFUSED in refused and says in refused and "\n" not in refused, refused


def test_verl_0_7_bucket_size_sets_the_checkpoint_engine_bucket():
    cfg = parse_overrides([MODEL, "actor_rollout_ref.rollout.update_weights_bucket_megabytes=1024"])
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes == 1024
