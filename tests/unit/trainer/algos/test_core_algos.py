"""The RL math against values computed by hand (the arithmetic is in each comment)."""

import math

import pytest
import torch

from rlrig.trainer.algos import core_algos as A
from rlrig.trainer.algos.estimators.gae import gae_advantages
from rlrig.trainer.algos.estimators.grpo import grpo_advantages
from rlrig.trainer.algos.estimators.reinforce_pp import reinforce_pp_advantages
from rlrig.trainer.algos.estimators.rloo import rloo_advantages
from rlrig.trainer.algos.policy_losses.vanilla import clipped_surrogate

T = torch.tensor


def close(a, b, tol=1e-4):
    assert torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol), (
        a,
        b,
    )


def test_gae_returns():
    # gamma=lam=0.5: t1 delta=1-0.5=0.5, A1=0.5; t0 delta=0+0.5*0.5-0.5=-0.25, A0=-0.25+0.25*0.5=-0.125
    _, ret = gae_advantages(T([[0.0, 1.0]]), T([[0.5, 0.5]]), T([[1.0, 1.0]]), 0.5, 0.5)
    close(ret, [[0.375, 1.0]])
    # gamma=lam=1: A=[0.5,0.5] -> returns = A + V = [1, 1]
    _, ret = gae_advantages(T([[0.0, 1.0]]), T([[0.5, 0.5]]), T([[1.0, 1.0]]), 1.0, 1.0)
    close(ret, [[1.0, 1.0]])


def test_gae_ignores_padding():
    adv, ret = gae_advantages(T([[1.0, 5.0]]), T([[0.0, 9.0]]), T([[1.0, 0.0]]), 1.0, 1.0)
    close(ret[0, 0], 1.0)  # the padded step's reward and value do not leak back
    close(adv[0, 1], 0.0)


def test_gae_steps_over_tokens_the_model_did_not_write():
    """A tool's tokens inside a multi-turn response (mask 0 between 1s): the recursion skips them, carrying A and V
    from the next token the model wrote (verl's "observation tokens"). gamma=lam=0.5, rewards [0, 9, 9, 1], values
    [0.5, 7, 7, 1], mask [1, 0, 0, 1]. t3: delta = 1 - 1 = 0, A3 = 0, V carried = 1. t2, t1: skipped (A stays 0,
    V stays 1). t0: delta = 0 + 0.5 * 1 - 0.5 = 0, A0 = 0 + 0.25 * 0 = 0 -> returns [0.5, 7, 7, 1] (A + V, A carried
    on the skipped tokens). With reward 2 at t3: delta3 = 1, A3 = 1; delta0 = 0.5 * 1 - 0.5 = 0, A0 = 0.25 * 1."""
    mask = T([[1.0, 0.0, 0.0, 1.0]])
    _, ret = gae_advantages(T([[0.0, 9.0, 9.0, 1.0]]), T([[0.5, 7.0, 7.0, 1.0]]), mask, 0.5, 0.5)
    close(ret, [[0.5, 7.0, 7.0, 1.0]])
    _, ret = gae_advantages(T([[0.0, 9.0, 9.0, 2.0]]), T([[0.5, 7.0, 7.0, 1.0]]), mask, 0.5, 0.5)
    close(ret, [[0.75, 8.0, 8.0, 2.0]])


def test_grpo_and_dr_grpo():
    # scores [1,0,0,0]: mean .25, unbiased std sqrt((.5625+3*.0625)/3)=.5 -> [1.5,-.5,-.5,-.5]
    mask = torch.ones(4, 2)
    adv, _ = grpo_advantages(T([1.0, 0, 0, 0]), mask, [0, 0, 0, 0])
    close(adv[:, 0], [1.5, -0.5, -0.5, -0.5], 1e-3)
    adv, _ = grpo_advantages(T([1.0, 0, 0, 0]), mask, [0, 0, 0, 0], norm_by_std=False)
    close(adv[:, 1], [0.75, -0.25, -0.25, -0.25])


def test_grpo_groups_are_separate():
    adv, _ = grpo_advantages(T([1.0, 0.0, 5.0, 5.0]), torch.ones(4, 1), [0, 0, 1, 1])
    close(adv[2:, 0], [0.0, 0.0])


def test_rloo():
    # s_i - mean(others): 1-0=1, 0-(1+0)/2=-.5
    adv, _ = rloo_advantages(T([1.0, 0.0, 0.0]), torch.ones(3, 1), [7, 7, 7])
    close(adv[:, 0], [1.0, -0.5, -0.5])


def test_reinforce_pp_returns():
    # G = [0+0.5*1, 1] with gamma .5
    _, ret = reinforce_pp_advantages(T([[0.0, 1.0]]), T([[1.0, 1.0]]), 0.5)
    close(ret, [[0.5, 1.0]])


def test_reinforce_pp_returns_pass_over_tokens_the_model_did_not_write():
    # gamma 0.5, rewards [0, 0, 1], token 1 an observation: G_2 = 1 ; G_1 = 0, carrying 1 ; G_0 = 0 + 0.5 * 1
    _, ret = reinforce_pp_advantages(T([[0.0, 0.0, 1.0]]), T([[1.0, 0.0, 1.0]]), 0.5)
    close(ret, [[0.5, 0.0, 1.0]])


@pytest.mark.parametrize(
    "kind,value",
    [
        ("kl", math.log(2)),  # logp - ref = 0 - ln .5
        ("abs", math.log(2)),
        ("mse", 0.5 * math.log(2) ** 2),  # 0.2402
        ("low_var_kl", 0.5 + math.log(0.5) * -1 - 1),  # e^-ln2 + ln2 - 1 = 0.1931
    ],
)
def test_kl_penalties(kind, value):
    close(A.kl_penalty(T([0.0]), T([math.log(0.5)]), kind), [value])


def test_low_var_kl_is_clamped():
    assert float(A.kl_penalty(T([0.0]), T([15.0]), "low_var_kl")) == 10.0


@pytest.mark.parametrize(
    "logp,adv,expected,clipfrac",
    [
        (math.log(1.5), 1.0, -1.2, 1.0),  # max(-1.5, -1.2)
        (math.log(1.5), -1.0, 1.5, 0.0),  # max(1.5, 1.2); dual clip min(3, 1.5)
        (math.log(5.0), -1.0, 3.0, 0.0),  # max(5, 1.2)=5 -> dual clip caps at c=3
        (0.0, 2.0, -2.0, 0.0),  # ratio 1: -A
    ],
)
def test_policy_loss(logp, adv, expected, clipfrac):
    loss, cf, _ = clipped_surrogate(T([[0.0]]), T([[logp]]), T([[adv]]), T([[1.0]]))
    close(loss, expected)
    close(cf, clipfrac)


def test_value_loss_clipped():
    # V=2, old=0, R=0, clip .5: max((2-0)^2, (0.5-0)^2)=4 -> 0.5*4
    loss, clipfrac = A.value_loss(T([[2.0]]), T([[0.0]]), T([[0.0]]), T([[1.0]]), 0.5)
    close(loss, 2.0)
    close(clipfrac, 0.0)


@pytest.mark.parametrize(
    "mode,value",
    [
        ("token-mean", 2.0),  # (1+2+3)/3
        ("seq-mean-token-sum", 3.0),  # (3+3)/2
        ("seq-mean-token-mean", 2.25),  # (1.5+3)/2
        ("seq-mean-token-sum-norm", 1.0),  # (3+3)/2 rows/3 columns: a sequence mean over the horizon, as verl 0.9
        ("token-sum", 6.0),  # 1+2+3
    ],
)
def test_agg_modes(mode, value):
    loss = T([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    close(A.agg_loss(loss, mask, mode), value)


@pytest.mark.parametrize(
    "logits,entropy",
    [
        ([0.0, 0.0, 0.0, 0.0], math.log(4)),  # uniform over 4
        ([0.0, math.log(3)], -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))),  # p = 1/4, 3/4: 0.5623
    ],
)
def test_entropy(logits, entropy):
    close(A.entropy_from_logprobs(torch.log_softmax(torch.tensor([logits]), -1)), [entropy])


def test_adaptive_kl_controller():
    # error = clip(0.2/0.1 - 1, +-0.2) = 0.2; beta = 0.1 * (1 + 0.2*10/100) = 0.102
    c = A.AdaptiveKLController(0.1, 0.1, 100)
    c.update(0.2, 10)
    assert math.isclose(c.value, 0.102)
    f = A.FixedKLController(0.1)
    f.update(5.0, 10)
    assert f.value == 0.1


def test_kl_in_reward():
    r, kl = A.apply_kl_in_reward(T([[0.0, 1.0]]), T([[0.0, 0.0]]), T([[-1.0, 0.0]]), T([[1.0, 1.0]]), 0.5, "kl")
    close(r, [[-0.5, 1.0]])  # r - beta * (logp - ref) = 0 - .5*1
    assert math.isclose(kl, 0.5)
