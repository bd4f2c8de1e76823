"""Each numeric key refused in one line when out of its domain, through the parser as a user's command line."""

import pytest

from rlrig.trainer.config import presets
from rlrig.trainer.config.domains import DOMAINS, FILES, value_at
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.config.presets import EMBEDDED
from rlrig.trainer.config.schema import Config, all_keys
from rlrig.trainer.errors import ConfigError

MODEL = "actor_rollout_ref.model.path=/m"

# values users tried that were once accepted, and the whole line each now gets
REFUSED = [
    ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr=-1 must be at least 0"),
    ("actor_rollout_ref.rollout.temperature=-1", "actor_rollout_ref.rollout.temperature=-1 must be at least 0"),
    ("actor_rollout_ref.rollout.top_p=2", "actor_rollout_ref.rollout.top_p=2 must be in (0, 1]"),
    ("algorithm.gamma=1.5", "algorithm.gamma=1.5 must be in [0, 1]"),
    ("algorithm.lam=-0.1", "algorithm.lam=-0.1 must be in [0, 1]"),
    ("actor_rollout_ref.actor.clip_ratio=-0.2", "actor_rollout_ref.actor.clip_ratio=-0.2 must be at least 0"),
    ("data.max_response_length=0", "data.max_response_length=0 must be at least 1"),
    ("data.max_prompt_length=-1", "data.max_prompt_length=-1 must be at least 1"),
    ("actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs=0 must be at least 1"),
    (
        "actor_rollout_ref.rollout.gpu_memory_utilization=1.5",
        "actor_rollout_ref.rollout.gpu_memory_utilization=1.5 must be in (0, 1]",
    ),
    ("trainer.total_epochs=-1", "trainer.total_epochs=-1 must be at least 1"),
    ("data.train_files=[]", "data.train_files=[] must be a file or a non-empty list of files"),
    ("algorithm.kl_ctrl.kl_coef=-1", "algorithm.kl_ctrl.kl_coef=-1 must be at least 0"),
    ("critic.cliprange_value=-1", "critic.cliprange_value=-1 must be at least 0"),
]

# more of the table, one case per kind of domain
REFUSED_TOO = [
    ("actor_rollout_ref.rollout.top_p=0", "actor_rollout_ref.rollout.top_p=0 must be in (0, 1]"),
    ("actor_rollout_ref.rollout.top_k=-2", "actor_rollout_ref.rollout.top_k=-2 must be at least -1 (-1 and 0 turn"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p=1.01", "actor_rollout_ref.rollout.val_kwargs.top_p=1.01 must be"),
    ("actor_rollout_ref.rollout.n=0", "actor_rollout_ref.rollout.n=0 must be at least 1"),
    ("trainer.total_training_steps=0", "trainer.total_training_steps=0 must be at least 1 (or null)"),
    (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0 must be at least 1 (or null)",
    ),
    ("critic.optim.weight_decay=-0.01", "critic.optim.weight_decay=-0.01 must be at least 0"),
    ("critic.optim.lr_warmup_steps_ratio=1.5", "critic.optim.lr_warmup_steps_ratio=1.5 must be in [0, 1]"),
    ("actor_rollout_ref.actor.optim.clip_grad=0", "actor_rollout_ref.actor.optim.clip_grad=0 must be positive"),
    ("actor_rollout_ref.actor.clip_ratio_c=1.0", "actor_rollout_ref.actor.clip_ratio_c=1 must be greater than 1"),
    ("actor_rollout_ref.actor.kl_loss_coef=-0.001", "actor_rollout_ref.actor.kl_loss_coef=-0.001 must be at least 0"),
    ("algorithm.lam=1e999", "algorithm.lam=inf must be in [0, 1]"),
    ("data.val_files=[]", "data.val_files=[] must be a file or a non-empty list of files"),
    ("trainer.placement_timeout_s=0", "trainer.placement_timeout_s=0 must be positive"),
    ("trainer.watchdog_min_s=0", "trainer.watchdog_min_s=0 must be positive"),
    ("trainer.watchdog_factor=0.5", "trainer.watchdog_factor=0.5 must be at least 1"),
    ("actor_rollout_ref.nccl_timeout=0", "actor_rollout_ref.nccl_timeout=0 must be positive"),
]

# the edges of each domain, and the values that mean "off"
ACCEPTED = [
    "actor_rollout_ref.actor.optim.lr=0",
    "actor_rollout_ref.rollout.top_p=1",
    "actor_rollout_ref.rollout.temperature=0",
    "actor_rollout_ref.rollout.top_k=-1",
    "actor_rollout_ref.rollout.top_k=0",
    "actor_rollout_ref.rollout.top_k=1",
    "algorithm.gamma=0",
    "algorithm.gamma=1",
    "algorithm.lam=0",
    "algorithm.lam=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=1",
    "actor_rollout_ref.actor.clip_ratio=0",
    "algorithm.kl_ctrl.kl_coef=0",
    "critic.cliprange_value=0",
    "actor_rollout_ref.actor.ppo_epochs=1",
    "trainer.total_epochs=1",
    "trainer.total_training_steps=1",
    "trainer.total_training_steps=null",
    "trainer.save_freq=-1",
    "trainer.test_freq=0",
    "actor_rollout_ref.actor.entropy_coeff=-0.01",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=1",
    "actor_rollout_ref.actor.optim.weight_decay=0",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
    "data.train_files=/d/train.parquet",
    "data.train_files=['/d/a.parquet','/d/b.parquet']",
    "ray_kwargs.ray_init.num_cpus=0",
]


@pytest.mark.parametrize("override,line", REFUSED + REFUSED_TOO)
def test_out_of_domain_refused_in_one_line(override, line):
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, override])
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("override,line", REFUSED)
def test_reported_values_get_exactly_their_line(override, line):
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, override])
    assert str(e.value) == line


@pytest.mark.parametrize("override", ACCEPTED)
def test_domain_edges_accepted(override):
    parse_overrides([MODEL, override])


def test_every_domain_names_a_key_of_the_schema():
    keys = set(all_keys(Config()))
    assert sorted(set(DOMAINS) - keys) == []


def test_nan_is_in_no_domain():
    nan = float("nan")
    assert [k for k, d in DOMAINS.items() if d is not FILES and d.refusal(k, nan) is None] == []


def test_defaults_are_in_their_domains():
    cfg = Config()
    assert [k for k, d in DOMAINS.items() if d.refusal(k, value_at(cfg, k))] == []


def test_presets_are_in_their_domains(monkeypatch):
    parse_overrides(EMBEDDED)
    monkeypatch.setattr(presets, "smollm2_dir", lambda: "/m")
    monkeypatch.setattr(presets, "instruct_arithmetic_files", lambda: ("/d/train.parquet", "/d/test.parquet"))
    parse_overrides(presets.with_preset("smollm2", []))


@pytest.mark.parametrize(
    "override,choices",
    [
        ("actor_rollout_ref.actor.loss_agg_mode=mean", "token-mean, token-sum, seq-mean-token-sum"),
        ("algorithm.adv_estimator=ppo", "gae, grpo"),
    ],
)
def test_enumerated_keys_name_their_choices(override, choices):
    key, value = override.split("=")
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, override])
    assert str(e.value).startswith(f"{key}={value!r}: choose one of {choices}")
