"""PPO's generalised advantage estimation with a critic (verl's default, `gae`)."""

from __future__ import annotations

import torch

from ..core_algos import AllReduce, local, masked_whiten
from .registry import AdvantageInput, register


def gae_advantages(rewards, values, mask, gamma: float, lam: float, allreduce: AllReduce = local):
    """(advantages, returns), both [B, R], from token rewards and the critic's values."""
    # delta_t = r_t + gamma * V_{t+1} - V_t ;  A_t = delta_t + gamma * lam * A_{t+1} ;  returns = A + V ;
    # A whitened over the whole batch (every worker's shard)
    T = rewards.shape[1]
    next_value = torch.zeros_like(rewards[:, 0])
    last = torch.zeros_like(rewards[:, 0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        # a token the model did not write (padding, a tool's or user's turn in a multi-turn response) is skipped: the
        # recursion carries A and V across it from the next token the model wrote (verl's "observation tokens")
        m = mask[:, t] > 0
        last = torch.where(m, delta + gamma * lam * last, last)
        next_value = torch.where(m, values[:, t], next_value)
        adv[:, t] = last
    returns = adv + values
    return masked_whiten(adv, mask, allreduce) * mask, returns


@register("gae", needs_critic=True)
def compute(x: AdvantageInput):
    """`gae`: the critic's values, algorithm.gamma and lam."""
    return gae_advantages(x.token_rewards, x.values, x.mask, x.gamma, x.lam, x.allreduce)
