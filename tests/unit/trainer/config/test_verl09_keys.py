"""The reference verl release's whole PPO trainer config (verl_keys_table/verl_<REFERENCE>_ppo_trainer.yaml: the
generated config its wheel ships, written by generate.py --release; REFERENCE is verl 0.9.1): every leaf key, at
verl's default, is taken or refused in one line naming it, never unknown; the file passed whole as
--config-path/--config-name reaches rlrig's validation; the new layout's keys set what the old ones set."""

import math
import pathlib

import pytest
import torch
import yaml

from rlrig.trainer.config import verl_keys
from rlrig.trainer.config.config_files import load
from rlrig.trainer.config.derived import TORCH_DEFAULT_SEED
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.config.schema import Config
from rlrig.trainer.errors import ConfigError

from .test_verl_keys_table import _another
from .verl_keys_table.generate import REFERENCE, flatten, header, release_file

FOLDER = pathlib.Path(__file__).with_name("verl_keys_table")
NAME = release_file(REFERENCE).stem
DEFAULTS = dict(flatten(yaml.safe_load((FOLDER / f"{NAME}.yaml").read_text())))
REFUSED = "a verl key rlrig does not implement: "
# verl defaults for 8 GPUs, taken and then checked against this machine (one CPU worker): a check of the value
CHECKED_ON_THIS_MACHINE = {
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "must divide trainer.n_gpus_per_node=1",
    "trainer.device": "on GPUs such a pass would hold its whole",
}


def answer(key: str, text: str) -> str:
    """accepted | unknown | refused (one line naming the key) | the error, as `rlrig train KEY=TEXT` answers."""
    try:
        try:
            parse_overrides(["actor_rollout_ref.model.path=/m", f"{key}={text}"])
        except ConfigError as e:
            if "Hydra" not in str(e):
                raise
            # a path (~/...) or a list of names (a,b) that Hydra's command line wants quoted, as a YAML file gives it
            parse_overrides(["actor_rollout_ref.model.path=/m", f"{key}='{text}'"])
    except ConfigError as e:
        message = str(e)
        assert "\n" not in message, message
        if message.startswith("unknown config key"):
            return "unknown"
        return "refused" if message.startswith(key) and REFUSED in message else message
    return "accepted"


def classification() -> dict[str, str]:
    return {key: answer(key, default) for key, default in DEFAULTS.items()}


def test_the_file_is_the_reference_release_generated_config():
    text = (FOLDER / f"{NAME}.yaml").read_text()
    assert text.startswith(header(REFERENCE))
    assert len(DEFAULTS) > 850
    for key in ("reward.reward_model.enable", "critic.fsdp.param_offload", "distillation.enabled", "skip._target_"):
        assert key in DEFAULTS


def test_every_verl_0_9_key_at_its_default_is_taken_never_unknown():
    got = classification()
    unknown = sorted(k for k, v in got.items() if v == "unknown")
    assert unknown == []
    refused = {k: v for k, v in got.items() if v != "accepted"}
    assert set(refused) <= set(CHECKED_ON_THIS_MACHINE), refused
    for key, says in CHECKED_ON_THIS_MACHINE.items():
        assert says in got[key], got[key]


def test_every_verl_0_9_key_at_another_value_is_taken_or_refused_never_unknown():
    plain = {k: d for k, d in DEFAULTS.items() if not d.startswith("${") and d != "???"}
    assert [k for k, d in plain.items() if answer(k, _another(d)) == "unknown"] == []


def test_verl_own_interpolations_are_its_defaults_and_another_value_is_not_unknown():
    for key, text in verl_keys.verl09_keys.FILLED.items():
        assert DEFAULTS[key] == text, key
        assert answer(key, "7777") != "unknown", key


def test_the_whole_file_passes_validation_with_the_micro_batches_verl_asks_for():
    """The generated file read as `--config-path FOLDER --config-name verl_<REFERENCE>_ppo_trainer`: no key unknown or
    refused, and with what verl too refuses to run without (the micro batches; the engine, ??? in the file), the
    config is rlrig's."""
    taken = load(str(FOLDER), NAME)
    assert len(taken) > 850
    with pytest.raises(ConfigError, match="ppo_micro_batch_size_per_gpu.* unset: on GPUs"):
        parse_overrides(taken)
    given = [*(f"{k}=4" for k in MICRO_BATCHES), "actor_rollout_ref.rollout.name=vllm"]
    cfg = parse_overrides([*taken, *given])
    assert cfg.actor_rollout_ref.rollout.seed == 42 and cfg.trainer.use_legacy_worker_impl == "auto"
    assert (cfg.reward_model.enable, cfg.reward_model.n_gpus_per_node, cfg.reward_model.reward_manager) == (
        False,
        8,
        "naive",
    )
    assert cfg.reward_model.rollout.name == Config().reward_model.rollout.name  # verl's ??? is not given
    assert cfg.custom_reward_function.name == "compute_score"
    assert cfg.data.seed == TORCH_DEFAULT_SEED == torch.Generator().initial_seed()  # verl's data.seed: null


MICRO_BATCHES = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size_per_gpu",
)


# verl 0.9's new place of a key -> the key rlrig stores it in, and a value to set
MOVED = [
    ("reward.reward_model.enable", "reward_model.enable", "True"),
    ("reward.reward_model.enable_resource_pool", "reward_model.enable_resource_pool", "True"),
    ("reward.reward_model.n_gpus_per_node", "reward_model.n_gpus_per_node", "2"),
    ("reward.reward_model.nnodes", "reward_model.nnodes", "1"),
    ("reward.reward_model.model_path", "reward_model.model.path", "/rm"),
    ("reward.reward_model.rollout.gpu_memory_utilization", "reward_model.rollout.gpu_memory_utilization", "0.3"),
    ("reward.reward_model.rollout.tensor_model_parallel_size", "reward_model.rollout.tensor_model_parallel_size", "2"),
    ("reward.reward_manager.name", "reward_model.reward_manager", "dapo"),
    ("reward.custom_reward_function.path", "custom_reward_function.path", "/r.py"),
    ("reward.custom_reward_function.name", "custom_reward_function.name", "score"),
    ("reward.reward_kwargs.overlong_buffer_cfg.len", "reward_model.reward_kwargs.overlong_buffer_cfg.len", "512"),
    ("reward.reward_kwargs.max_resp_len", "reward_model.reward_kwargs.max_resp_len", "1024"),
    ("critic.fsdp.param_offload", "critic.model.fsdp_config.param_offload", "True"),
    ("critic.fsdp.optimizer_offload", "critic.model.fsdp_config.optimizer_offload", "True"),
    ("critic.fsdp.fsdp_size", "critic.model.fsdp_config.fsdp_size", "2"),
    ("critic.fsdp.model_dtype", "critic.model.fsdp_config.model_dtype", "bf16"),
]


def _at(cfg, key):
    for part in key.split("."):
        cfg = cfg.get(part) if isinstance(cfg, dict) else getattr(cfg, part, None)
    return cfg


@pytest.mark.parametrize("new,old,value", MOVED)
def test_a_moved_key_sets_what_its_old_name_sets(new, old, value):
    from rlrig.trainer.config.overrides import set_key

    by_new, by_old = Config(), Config()
    set_key(by_new, new, value)
    set_key(by_old, old, value)
    assert _at(by_new, old) == _at(by_old, old) != _at(Config(), old)


@pytest.mark.parametrize(
    "key",
    [
        "reward_model.enable",
        "reward_model.reward_manager",
        "reward_model.model.path",
        "reward_model.rollout.gpu_memory_utilization",
        "custom_reward_function.name",
    ],
)
def test_a_legacy_reward_key_at_null_leaves_the_new_layout_value(key):
    """verl 0.9 moves reward_model.*, custom_reward_function.* into reward.* only where they are not null."""
    from rlrig.trainer.config.overrides import set_key

    cfg = Config()
    before = _at(cfg, key)
    set_key(cfg, key, "null")
    assert _at(cfg, key) == before


def test_hydras_missing_value_leaves_rlrig_default():
    """`???` (verl's reward.reward_model.rollout.name) is OmegaConf's missing value: nothing is set."""
    cfg = parse_overrides(["actor_rollout_ref.model.path=/m", "reward.reward_model.rollout.name=???"])
    assert cfg.reward_model.rollout.name == Config().reward_model.rollout.name


NEW_AT_DEFAULT = sorted(
    k
    for k in verl_keys.ACCEPTED_DEFAULTS
    if k in DEFAULTS and "${" not in DEFAULTS[k] and DEFAULTS[k] != "???" and not k.endswith("._target_")
)


@pytest.mark.parametrize("key", NEW_AT_DEFAULT)
def test_a_key_taken_at_verl_0_9_default_refuses_any_other_value_in_one_line(key):
    with pytest.raises(ConfigError) as e:
        parse_overrides(["actor_rollout_ref.model.path=/m", f"{key}={_another(DEFAULTS[key])}"])
    text = str(e.value)
    assert "\n" not in text and key in text and "a verl key rlrig does not implement" in text, text


def test_rollout_seed_seeds_engine_r_with_seed_plus_r_as_verl():
    """verl's vLLM server seeds replica r with rollout.seed + r; without the key rlrig keeps its own trainer.seed."""
    from rlrig.trainer.workers.base import engine_seed

    cfg = parse_overrides(["actor_rollout_ref.model.path=/m", "actor_rollout_ref.rollout.seed=42"])
    assert [engine_seed(cfg, r, own=7) for r in range(3)] == [42, 43, 44]
    assert engine_seed(Config(), 2, own=7) == 7


@pytest.mark.parametrize(
    "override,says",
    [
        ("critic.fsdp.qat.enable=True", "quantization-aware training is not in rlrig"),
        ("critic.fsdp.forward_prefetch=True", "with no prefetch"),
        ("reward.reward_model.rollout.temperature=0.7", "a generative judge's requests carry their own sampling"),
        ("reward.reward_model.rollout.quantization=fp8", "not in rlrig's judge or reward engines"),
        ("trainer.v1.trainer_mode=separate_async", "trainer.async_mode=one_step_off_policy"),
    ],
)
def test_a_new_key_rlrig_does_not_implement_is_refused_in_one_line_naming_it(override, says):
    with pytest.raises(ConfigError) as e:
        parse_overrides(["actor_rollout_ref.model.path=/m", override])
    text = str(e.value)
    assert text.startswith(override.split("=")[0]) and says in text and "\n" not in text, text


def _verl_cosine(step: int, warmup: int, total: int, min_ratio: float, zero_indexed_step: bool) -> float:
    """verl 0.9.1's get_cosine_schedule_with_warmup lr_lambda (verl/utils/torch_functional.py), as its FSDP engine
    calls it (init_lr_ratio not given: 0, num_cycles 0.5)."""
    if not zero_indexed_step:
        step += 1
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return max(min_ratio, math.cos(math.pi * 0.5 * 2.0 * progress) * (1 - min_ratio) * 0.5 + (1 + min_ratio) * 0.5)


@pytest.mark.parametrize("zero_indexed", [True, False])
def test_zero_indexed_step_moves_the_cosine_schedule_as_verl(zero_indexed):
    from rlrig.trainer.model.lr_schedule import lr_at

    optim = "actor_rollout_ref.actor.optim"
    cfg = parse_overrides(
        [
            "actor_rollout_ref.model.path=/m",
            f"{optim}.lr_scheduler_type=cosine",
            f"{optim}.lr_warmup_steps=3",
            f"{optim}.lr=1.0",
            f"{optim}.zero_indexed_step={zero_indexed}",
        ]
    )
    o = cfg.actor_rollout_ref.actor.optim
    assert [lr_at(o, s, 10) for s in range(10)] == pytest.approx(
        [_verl_cosine(s, 3, 10, 0.0, zero_indexed) for s in range(10)]
    )
    constant = parse_overrides(["actor_rollout_ref.model.path=/m", f"{optim}.zero_indexed_step={zero_indexed}"])
    o = constant.actor_rollout_ref.actor.optim
    assert [lr_at(o, s, 10) for s in range(3)] == [o.lr] * 3  # verl's constant schedule does not read it
