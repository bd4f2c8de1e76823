"""The extension points: each estimator, policy loss and engine declares what it needs, config
validation reads those declarations, and a new one is one module plus one registration."""

import pytest

from rlrig.trainer import metrics
from rlrig.trainer.algos import estimators, policy_losses
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.rollout import engines

MODEL = "actor_rollout_ref.model.path=/m"


@pytest.mark.parametrize(
    "name,critic,groups,greedy",
    [
        ("gae", True, False, False),
        ("grpo", False, False, False),  # a group of one: baseline 0, as verl
        ("rloo", False, False, False),
        ("grpo_passk", False, True, False),  # verl raises below 2 samples
        ("reinforce_plus_plus", False, False, False),
        ("remax", False, False, True),
    ],
)
def test_estimators_declare_what_they_need(name, critic, groups, greedy):
    e = estimators.get(name)
    assert (e.needs_critic, e.needs_groups, e.needs_greedy_baseline) == (critic, groups, greedy)


def test_a_new_estimator_is_one_registration(monkeypatch):
    monkeypatch.setattr(estimators.registry, "ESTIMATORS", dict(estimators.ESTIMATORS))
    with pytest.raises(ConfigError, match="choose one of"):
        parse_overrides([MODEL, "algorithm.adv_estimator=sign"])

    @estimators.register("sign", needs_groups=True)
    def sign(x):  # A = sign(score), on every response token
        return x.token_rewards.sum(-1, keepdim=True).sign() * x.mask, x.token_rewards

    for module in ("schema", "validation"):  # the modules that read the registry
        monkeypatch.setattr(f"rlrig.trainer.config.{module}.ESTIMATORS", estimators.registry.ESTIMATORS)
    cfg = parse_overrides([MODEL, "algorithm.adv_estimator=sign", "actor_rollout_ref.rollout.n=2"])
    assert cfg.algorithm.adv_estimator == "sign"
    with pytest.raises(ConfigError, match="rollout.n to 2"):  # its declaration, read by validation
        parse_overrides([MODEL, "algorithm.adv_estimator=sign"])
    with pytest.raises(ValueError, match="registered twice"):
        estimators.register("sign")(sign)


def test_policy_loss_registry_and_unknown_names():
    assert "vanilla" in policy_losses.POLICY_LOSSES
    with pytest.raises(
        ConfigError,
        match=r"loss_mode=.nope.: choose one of vanilla, cispo, clip_cov, dro, geo_mean, gpg, gspo, kl_cov, sapo",
    ):
        parse_overrides([MODEL, "actor_rollout_ref.actor.policy_loss.loss_mode=nope"])
    with pytest.raises(ValueError, match="registered twice"):
        policy_losses.register("vanilla")(lambda *a: None)


def test_engine_names_come_from_the_registry():
    assert set(engines.NAMES) == {"hf", "vllm", "sglang", "auto"}
    with pytest.raises(ConfigError, match="choose one of hf, vllm, sglang, auto"):
        parse_overrides([MODEL, "actor_rollout_ref.rollout.name=trtllm"])


@pytest.mark.parametrize(
    "name,values,expect",
    [
        ("critic/score/mean", [1.0, 3.0], 2.0),
        ("critic/score/max", [1.0, 3.0], 3.0),
        ("response_length/min", [4.0, 2.0], 2.0),
        ("timing_s/gen", [1.5, 0.5], 1.5),  # the step waits for the slowest worker
        ("perf/total_num_tokens", [10.0, 30.0], 40.0),
        ("critic/advantages/mean", [1.0, 0.0], 0.25),  # token-weighted: 10 and 30 response tokens
    ],
)
def test_metric_reduction(name, values, expect):
    results = [{name: v, metrics.TOKENS: w} for v, w in zip(values, (10.0, 30.0))]
    assert metrics.reduce(results) == {name: pytest.approx(expect)}


def test_unknown_metric_is_an_error_not_a_guess():
    with pytest.raises(KeyError, match="add it to rlrig/trainer/metrics.py"):
        metrics.reduce([{"actor/new_thing_max": 1.0}])


def test_a_metric_only_some_workers_report():
    assert metrics.reduce([{"actor/kl_loss": 2.0}, {}]) == {"actor/kl_loss": 2.0}


@pytest.mark.parametrize(
    "rows,parts,shards,spread",
    [
        (list(range(6)), 2, [[0, 1, 2], [3, 4, 5]], [[0, 1, 2], [3, 4, 5]]),
        (list(range(5)), 2, [[0, 1], [2, 3]], [[0, 1, 2], [3, 4]]),  # training drops the remainder; validation keeps it
        (list(range(1)), 3, [[], [], []], [[0], [], []]),
    ],
)
def test_sharding_of_prompts_over_workers(rows, parts, shards, spread):
    from rlrig.trainer.driver.modes import equal_shares
    from rlrig.trainer.driver.validation import spread as spread_rows

    assert equal_shares(rows, parts) == shards and spread_rows(rows, parts) == spread
