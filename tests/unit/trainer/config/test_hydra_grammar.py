"""Overrides as verl's Hydra entry point reads them: each one composed by Hydra itself (hydra.compose over a config
holding rlrig's defaults, interpolations resolved by OmegaConf) gives the value rlrig's config gets; what Hydra
refuses, rlrig refuses in one line."""

import dataclasses

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlrig.trainer.config.domains import value_at
from rlrig.trainer.config.literals import as_raw, parse_literal
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.config.schema import Config
from rlrig.trainer.errors import ConfigError

MODEL = "actor_rollout_ref.model.path=/m"


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


@pytest.fixture(scope="module")
def hydra_config_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hydra")
    (folder / "base.yaml").write_text(yaml.safe_dump(_plain(dataclasses.asdict(Config()))))
    return str(folder)


def hydra_sees(config_dir: str, overrides: list[str], key: str):
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="base", overrides=overrides)
    node = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


# (overrides, the key read back); the cases first, then the grammar's corners verl scripts use
SAME_AS_HYDRA = [
    (['data.train_files=["/d/a,b.parquet",c]'], "data.train_files"),
    (["actor_rollout_ref.actor.clip_ratio_c=inf"], "actor_rollout_ref.actor.clip_ratio_c"),
    ([r"trainer.experiment_name=a\,b"], "trainer.experiment_name"),
    (["trainer.experiment_name= spaced "], "trainer.experiment_name"),
    (["trainer.experiment_name=' spaced '"], "trainer.experiment_name"),
    (["trainer.experiment_name=${oc.env:RLRIG_GRAMMAR_VAR}"], "trainer.experiment_name"),
    (["trainer.experiment_name=${oc.env:RLRIG_GRAMMAR_UNSET,fallback}"], "trainer.experiment_name"),
    (["trainer.project_name=p", "trainer.experiment_name=${.project_name}-x"], "trainer.experiment_name"),
    (
        ["trainer.experiment_name=e", "trainer.default_local_dir=ck/${trainer.experiment_name}"],
        "trainer.default_local_dir",
    ),
    (
        ["trainer.default_local_dir=ck/${trainer.experiment_name}", "trainer.experiment_name=later"],
        "trainer.default_local_dir",
    ),
    (
        ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=${data.train_batch_size}"],
        "actor_rollout_ref.actor.ppo_mini_batch_size",
    ),
    (["critic.ppo_micro_batch_size_per_gpu=${oc.select:no.such.key,2}"], "critic.ppo_micro_batch_size_per_gpu"),
    (["trainer.logger=[console,wandb]"], "trainer.logger"),
    (["trainer.logger=['console']"], "trainer.logger"),
    (["trainer.total_epochs=int(3.0)"], "trainer.total_epochs"),
    (["trainer.total_epochs=1_000"], "trainer.total_epochs"),
    (["actor_rollout_ref.actor.optim.lr=1e-6"], "actor_rollout_ref.actor.optim.lr"),
    (["actor_rollout_ref.actor.optim.lr=.5e-5"], "actor_rollout_ref.actor.optim.lr"),
    (["trainer.experiment_name='it\\'s'"], "trainer.experiment_name"),
    (['trainer.experiment_name="a b=c"'], "trainer.experiment_name"),
    (["trainer.experiment_name=Qwen/Qwen2.5-7B:v1@main"], "trainer.experiment_name"),
    (["trainer.experiment_name=None"], "trainer.experiment_name"),
    (["trainer.experiment_name=2024-01-01"], "trainer.experiment_name"),
    (["actor_rollout_ref.rollout.max_model_len=null"], "actor_rollout_ref.rollout.max_model_len"),
    (["trainer.val_before_train=False"], "trainer.val_before_train"),
    (["trainer.val_before_train=true"], "trainer.val_before_train"),
    (["++trainer.experiment_name=forced"], "trainer.experiment_name"),
]


@pytest.mark.parametrize("overrides, key", SAME_AS_HYDRA)
def test_an_override_gets_the_value_hydra_gives_verl(hydra_config_dir, monkeypatch, overrides, key):
    monkeypatch.setenv("RLRIG_GRAMMAR_VAR", "from-env")
    monkeypatch.delenv("RLRIG_GRAMMAR_UNSET", raising=False)
    expected = hydra_sees(hydra_config_dir, overrides, key)
    assert value_at(parse_overrides([MODEL, *overrides]), key) == expected


# refused by Hydra's parser (or by one composed config), so by rlrig: one line naming the override
REFUSED = [
    ("trainer.logger=console,wandb", "sweep"),
    ("trainer.total_epochs=range(1,3)", "sweep"),
    ("trainer.experiment_name=a=b", "Hydra cannot parse it"),
    ("trainer.experiment_name=~/x", "Hydra cannot parse it"),
    ("trainer.experiment_name@pkg=x", "@package"),
    ("trainer.experiment_name=${oc.env:RLRIG_GRAMMAR_UNSET}", "Environment variable 'RLRIG_GRAMMAR_UNSET' not found"),
    ("trainer.experiment_name=${no.such.key}", "Interpolation key 'no.such.key' not found"),
    ("trainer.experiment_name=${nope:x}", "Unsupported interpolation type nope"),
    ("trainer.experiment_name=${trainer.experiment_name}", "Recursive interpolation"),
]


@pytest.mark.parametrize("override, says", REFUSED)
def test_what_hydra_refuses_rlrig_refuses_in_one_line(hydra_config_dir, monkeypatch, override, says):
    monkeypatch.delenv("RLRIG_GRAMMAR_UNSET", raising=False)
    with pytest.raises((HydraException, OmegaConfBaseException)):  # at parse, at compose or when the value is read
        with initialize_config_dir(config_dir=hydra_config_dir, version_base=None):
            OmegaConf.to_container(compose(config_name="base", overrides=[override]), resolve=True)
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, override])
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


# A mapping given whole to a mapping key: Hydra's struct mode refuses the new keys (verl's scripts add them one by one
# with `+`); rlrig takes the mapping, as the one-by-one form gives it in Hydra.
@pytest.mark.parametrize(
    "whole, one_by_one, key",
    [
        (
            "data.apply_chat_template_kwargs={enable_thinking:false}",
            ["+data.apply_chat_template_kwargs.enable_thinking=false"],
            "data.apply_chat_template_kwargs",
        ),
        (
            "actor_rollout_ref.model.override_config={attention_dropout:0.0,rope_theta:1e6}",
            [
                "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
                "+actor_rollout_ref.model.override_config.rope_theta=1e6",
            ],
            "actor_rollout_ref.model.override_config",
        ),
    ],
)
def test_a_whole_mapping_is_the_mapping_hydra_builds_key_by_key(hydra_config_dir, whole, one_by_one, key):
    assert value_at(parse_overrides([MODEL, whole]), key) == hydra_sees(hydra_config_dir, one_by_one, key)
    assert value_at(parse_overrides([MODEL, *one_by_one]), key) == hydra_sees(hydra_config_dir, one_by_one, key)


def test_deleting_a_key_is_refused_in_one_line():
    # Hydra drops the key from verl's config, which then reads it as missing; every key rlrig has is set
    with pytest.raises(ConfigError, match="deletes a key in Hydra; .* set it"):
        parse_overrides([MODEL, "~trainer.logger"])


def test_null_for_none_in_a_number_key_is_named():
    with pytest.raises(ConfigError, match="Hydra reads None as the text 'None'; write .*=null"):
        parse_overrides([MODEL, "actor_rollout_ref.rollout.max_model_len=None"])


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -3, 1.5, 1e-6, float("inf"), "", "a b", " lead", "a,b", "it's", "x\\", "q\\'", "${a.b}", "null",
     "None", "True", "1", "[x]", "{k}", "a=b", "~x", "new\nline", [1, "a b", None], {"k": [1, 2], "m": "x,y"}, [], {}],
)  # fmt: skip
def test_a_value_written_as_text_reads_back_the_same(value):
    assert parse_literal(as_raw(value)) == value
