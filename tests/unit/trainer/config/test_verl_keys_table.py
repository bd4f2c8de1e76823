"""Every key of verl's PPO trainer config (verl_keys_table/verl_trainer_keys.tsv, written by generate.py beside it)
is implemented, accepted because it changes nothing, or refused in one line with what rlrig offers: none is unknown."""

import dataclasses
import pathlib
import re

import pytest

from rlrig.trainer.config import verl_keys
from rlrig.trainer.config.interpolation import as_raw
from rlrig.trainer.config.literals import parse_literal, yaml_value
from rlrig.trainer.config.overrides import parse_overrides, set_key
from rlrig.trainer.config.schema import Config, all_keys
from rlrig.trainer.config.verl_keys import ALIASES
from rlrig.trainer.errors import ConfigError

TABLE = pathlib.Path(__file__).with_name("verl_keys_table") / "verl_trainer_keys.tsv"
ROWS = [line.split("\t") for line in TABLE.read_text().splitlines() if line and not line.startswith("#")]
DEFAULTS = {key: default for key, default, _ in ROWS}

# Implemented keys whose verl default the parser refuses (none: data.seed=null is torch's default generator seed)
DEFAULT_REFUSED_BY_SCHEMA: set[str] = set()
REFUSED = "a verl key rlrig does not implement: "
SELECT = re.compile(r"\$\{(?:oc\.select:)?([^,}]+)(?:,([^}]*))?\}")


def rlrig_default(key: str):
    obj = Config()
    for part in key.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def verl_value(key: str, default: str) -> str:
    """verl's default as an override: `${oc.select:a.b,d}` is a.b's value in rlrig where rlrig has a.b, else d."""
    m = SELECT.fullmatch(default.strip())
    if not default and key in all_keys(Config()):  # a key of verl's examples, with no default in the table
        return as_raw(rlrig_default(key))
    if not m:
        return as_raw(yaml_value(default)) if default else "null"  # the table holds verl's YAML text
    ref, fallback = m.group(1).strip(), m.group(2)
    if ref in all_keys(Config()):
        return as_raw(rlrig_default(ref))
    return (fallback or "null").strip().strip('"')


def known(key: str) -> bool:
    key = ALIASES.get(key, key)
    cfg = Config()
    if key in all_keys(cfg):
        return True
    parts = key.split(".")  # an item of a mapping rlrig takes whole (reward_model.reward_kwargs.overlong_buffer_cfg)
    for cut in range(len(parts) - 1, 0, -1):
        obj = cfg
        try:
            for p in parts[:cut]:
                obj = getattr(obj, p)
        except AttributeError:
            continue
        return isinstance(obj, dict)
    return False


def outcome(key: str, value: str) -> str:
    """implemented | no-effect | accepted-at-default | refused | unknown, as `rlrig train KEY=VALUE` answers."""
    try:
        set_key(Config(), key, parse_literal(value))
    except ConfigError as e:
        text = str(e)
        assert "\n" not in text, text
        if text.startswith("unknown config key"):
            return "unknown"
        if known(key):
            return f"implemented, but verl's default is refused: {text}"
        assert text.startswith(f"{key}: {REFUSED}") and len(text) > len(f"{key}: {REFUSED}") + 10, text
        return "refused"
    if known(key):
        return "implemented"
    if key in verl_keys.NO_EFFECT:
        return "no-effect"
    assert verl_keys.accepted_default(key, value), f"{key}={value} accepted for no reason"
    return "accepted-at-default"


def classification() -> dict[str, str]:
    return {key: outcome(key, verl_value(key, default)) for key, default in DEFAULTS.items()}


def test_the_table_is_verl_whole_config():
    assert TABLE.read_text().startswith("# verl b178a3cd56f58b2d502255daba591e92833930a7")
    assert len(DEFAULTS) == len(ROWS) > 600
    for key in (
        "actor_rollout_ref.actor.optim.clip_grad",
        "actor_rollout_ref.rollout.engine_kwargs.vllm",
        "trainer.max_actor_ckpt_to_keep",
        "algorithm.filter_groups.enable",
    ):
        assert key in DEFAULTS


def test_every_verl_key_at_its_default_is_implemented_accepted_or_refused_never_unknown():
    got = classification()
    assert [k for k, v in got.items() if v == "unknown"] == []
    assert {k for k, v in got.items() if v.startswith("implemented, but")} <= DEFAULT_REFUSED_BY_SCHEMA
    counts = {v: sum(1 for x in got.values() if x == v) for v in set(got.values())}
    assert counts["implemented"] > 200 and counts["refused"] > 100, counts


def _another(default: str) -> str:
    v = yaml_value(default.strip())
    if isinstance(v, bool):
        return str(not v)
    if v is None or isinstance(v, (list, dict)):
        return "rlrig-test-value"
    return "7777" if isinstance(v, (int, float)) else "rlrig-test-value"


@pytest.mark.parametrize("key", sorted(k for k in verl_keys.ACCEPTED_DEFAULTS if k in DEFAULTS))
def test_a_key_accepted_at_verl_default_refuses_any_other_value(key):
    assert outcome(key, _another(DEFAULTS[key])) == "refused"


def test_accepted_defaults_are_verl_defaults():
    for key, spellings in verl_keys.ACCEPTED_DEFAULTS.items():
        if DEFAULTS.get(key) and "${" not in DEFAULTS[key]:  # a key of the examples alone has no default
            assert verl_keys.accepted_default(key, DEFAULTS[key]), (key, DEFAULTS[key], spellings)


def test_no_effect_keys_are_listed_by_print_config_with_their_reason():
    shown = Config().described()["_no_effect_in_rlrig"]
    for key, why in verl_keys.NO_EFFECT.items():
        assert shown[key] == why and len(why) > 10
        assert outcome(key, "rlrig-test-value" if not known(key) else as_raw(rlrig_default(key))) in (
            "no-effect",
            "implemented",
        )


@pytest.mark.parametrize(
    "override,words",
    [
        ("actor_rollout_ref.rollout.total_rollout_steps=100", "top-level rollout.total_rollout_steps"),
        ("actor_rollout_ref.rollout.nnodes=2", "top-level rollout.nnodes"),
        ("actor_rollout_ref.rollout.agent.custom_async_server.path=s.py", "a server class of your own"),
        ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "Megatron"),
        ("critic.strategy=megatron", "rlrig shards the critic as it does the actor"),
        ("trainer.max_actor_ckpt_to_keep=3", "rlrig keeps every checkpoint"),
        ("actor_rollout_ref.actor.optim.betas=[0.9,0.95]", "torch's betas"),
        ("actor_rollout_ref.actor._target_=my.Config", "accepts only verl's own"),
    ],
)
def test_refusals_name_what_rlrig_offers(override, words):
    with pytest.raises(ConfigError) as e:
        parse_overrides(["actor_rollout_ref.model.path=/m", override])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_verl_defaults_pass_in_any_spelling():
    parse_overrides(
        [
            "actor_rollout_ref.model.path=/m",
            "actor_rollout_ref.actor.optim.betas=[0.9,0.999]",
            "actor_rollout_ref.actor.fsdp_config.offload_policy=false",
            "actor_rollout_ref.nccl_timeout=600.0",
            "actor_rollout_ref.actor.use_torch_compile=False",
            "trainer.ray_wait_register_center_timeout=60",
        ]
    )


@pytest.mark.parametrize(
    "key,near",
    [
        ("actor_rollout_ref.actor.optim.lrr", "actor_rollout_ref.actor.optim.lr"),
        ("actor.optim.lr", "actor_rollout_ref.actor.optim.lr"),  # the last part first, then the whole path
        ("critic.optim.lr", "critic.optim.lr"),
        ("actor_rollout_ref.rollout.temprature", "actor_rollout_ref.rollout.temperature"),
        ("rollout.n", "actor_rollout_ref.rollout.n"),
        ("trainer.total_epoch", "trainer.total_epochs"),
        ("critic.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu"),
        ("ref.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
        ("zzzz.qqqq", None),
    ],
)
def test_suggest_takes_the_last_part_then_the_edit_distance(key, near):
    assert verl_keys.suggest(key, all_keys(Config())) == near


def test_print_config_sections_stay_dataclass_fields():
    assert dataclasses.is_dataclass(Config())
