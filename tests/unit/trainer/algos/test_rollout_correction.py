"""Rollout correction (algorithm.rollout_correction.*): verl's truncated importance weights between the actor's
old log-probs and the engine's, against hand-computed values, and their effect on every policy loss."""

import math

import pytest
import torch

from rlrig.trainer.algos.policy_losses import POLICY_LOSSES
from rlrig.trainer.algos.rollout_correction import is_weights
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

alone = lambda t: t  # noqa: E731  (one worker: the all-reduce is the identity)
L = math.log


def weights(log_ratio, mask, level, threshold=2.0, normalize=False, allreduce=alone):
    lr, m = torch.tensor(log_ratio), torch.tensor(mask)
    return is_weights(lr, torch.zeros_like(lr), m, level, threshold, normalize, allreduce)


@pytest.mark.parametrize(
    "log_ratio, mask, level, normalize, allreduce, expected, metrics",
    [
        # token: exp(old - engine) = [3, 0.5, pad] -> truncated at 2: [2, 0.5, 0]; mean before truncation (3 + 0.5) / 2
        (
            [[L(3), L(0.5), 5.0]],
            [[1.0, 1.0, 0.0]],
            "token",
            False,
            alone,
            [[2.0, 0.5, 0.0]],
            {
                "rollout_is_max": 3.0,
                "rollout_is_min": 0.5,
                "rollout_is_mean": 1.75,
                "rollout_is_ratio_fraction_high": 0.5,
                "rollout_is_ratio_fraction_low": 0.0,
            },
        ),
        # sequence: row 0 sums to ln 4 -> 4 -> 2 on both tokens; row 1 ln 0.5 -> 0.5 on its one token
        (
            [[L(2), L(2)], [L(0.5), 3.0]],
            [[1.0, 1.0], [1.0, 0.0]],
            "sequence",
            False,
            alone,
            [[2.0, 2.0], [0.5, 0.0]],
            {
                "rollout_is_max": 4.0,
                "rollout_is_min": 0.5,
                "rollout_is_mean": 8.5 / 3,
                "rollout_is_ratio_fraction_high": 0.5,
                "rollout_is_ratio_fraction_low": 0.0,
            },
        ),
        # batch-normalized token weights: [2, 0.5] / 1.25
        ([[L(3), L(0.5)]], [[1.0, 1.0]], "token", True, alone, [[1.6, 0.4]], {"rollout_is_batch_norm_factor": 1.25}),
        # ... with another worker's 2 tokens weighing 5 in all: mean (2.5 + 5) / 4 = 1.875
        (
            [[L(3), L(0.5)]],
            [[1.0, 1.0]],
            "token",
            True,
            lambda t: t + torch.tensor([5.0, 2.0]),
            [[2 / 1.875, 0.5 / 1.875]],
            {"rollout_is_batch_norm_factor": 1.875},
        ),
        # batch-normalized sequence weights: one per sequence, [2, 0.5] / 1.25
        (
            [[L(2), L(2)], [L(0.5), 3.0]],
            [[1.0, 1.0], [1.0, 0.0]],
            "sequence",
            True,
            alone,
            [[1.6, 1.6], [0.4, 0.0]],
            {"rollout_is_batch_norm_factor": 1.25},
        ),
        # a huge log ratio is clamped at 20 before exp, then truncated
        ([[50.0]], [[1.0]], "token", False, alone, [[2.0]], {"rollout_is_max": math.exp(20.0)}),
    ],
)
def test_weights_by_hand(log_ratio, mask, level, normalize, allreduce, expected, metrics):
    w, m = weights(log_ratio, mask, level, normalize=normalize, allreduce=allreduce)
    torch.testing.assert_close(w, torch.tensor(expected))
    assert not w.requires_grad
    for k, v in metrics.items():
        assert m[f"rollout_corr/{k}"] == pytest.approx(v, rel=1e-5), k


def test_weights_carry_no_gradient_to_the_log_probs():
    old = torch.tensor([[0.1, -0.2]], requires_grad=True)
    w, _ = is_weights(old, torch.zeros(1, 2), torch.ones(1, 2), "token", 2.0, False, alone)
    assert not w.requires_grad


def test_vanilla_weighs_each_tokens_loss_by_hand():
    # ratio 1 (old == new), A = [1, -1]: per-token loss -A r = [-1, 1]; weights [2, 0.5] -> [-2, 0.5]; token-mean -0.75
    cfg = parse_overrides([]).actor_rollout_ref.actor
    logp = torch.zeros(1, 2)
    loss, _ = POLICY_LOSSES["vanilla"].fn(
        logp, logp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), cfg, "token-mean", torch.tensor([[2.0, 0.5]])
    )
    assert loss.item() == pytest.approx(-0.75)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_takes_the_weights(name):
    """Weights of 1 change nothing; weights of 2 double the loss (every loss is linear in its tokens' weights,
    geo_mean through their geometric mean per sequence)."""
    cfg = parse_overrides([]).actor_rollout_ref.actor
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g)
    logp = old + 0.1 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.ones(3, 5)
    mask[2, 3:] = 0
    fn = POLICY_LOSSES[name].fn

    def run(w):
        torch.manual_seed(1)  # clip_cov draws the tokens it cuts out
        return fn(old, logp, adv, mask, cfg, "token-mean", w)[0]

    plain = run(None)
    assert run(torch.ones(3, 5)).item() == pytest.approx(plain.item(), rel=1e-6, abs=1e-7)
    assert run(torch.full((3, 5), 2.0)).item() == pytest.approx(2 * plain.item(), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.rollout_correction.rollout_rs=token"], "not rejection sampling or bypass mode"),
        (
            ["algorithm.rollout_correction.bypass_mode=True"],
            "algorithm.rollout_correction.bypass_mode: a verl key rlrig does not implement",
        ),
        (
            ["algorithm.rollout_correction.loss_type=reinforce"],
            "algorithm.rollout_correction.loss_type: a verl key rlrig does not implement",
        ),
        (["algorithm.rollout_correction.rollout_rs_threshold=0.5"], "not rejection sampling"),
        (["algorithm.rollout_correction.rollout_is=geometric"], "choose token, sequence or null"),
        (
            ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=0"],
            "must be positive",
        ),
        (
            ["algorithm.rollout_correction.rollout_is=token", "actor_rollout_ref.rollout.name=hf"],
            "the hf engine does not compute",
        ),
    ],
)
def test_config_refusals(overrides, message):
    with pytest.raises(ConfigError) as e:
        parse_overrides(overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_verl_defaults_accepted():
    rc = parse_overrides(
        [
            "algorithm.rollout_correction.rollout_is=null",
            "algorithm.rollout_correction.rollout_rs=null",
            "algorithm.rollout_correction.bypass_mode=False",
            "algorithm.rollout_correction.loss_type=ppo_clip",
            "algorithm.rollout_correction.rollout_is_threshold=2.0",
        ]
    ).algorithm.rollout_correction
    assert rc.rollout_is is None and rc.rollout_is_threshold == 2.0
