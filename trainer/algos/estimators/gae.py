"""PPO's generalised advantage estimation with a critic (verl's default, `gae`)."""

from __future__ import annotations

import torch

from ..core_algos import AllReduce, local, masked_whiten
from .registry import AdvantageInput, register


def gae_advantages(rewards, values, mask, gamma: float, lam: float, allreduce: AllReduce = local):
    # delta_t = r_t + gamma * V_{t+1} - V_t ;  A_t = delta_t + gamma * lam * A_{t+1} ;  returns = A + V ;
    # A whitened over the whole batch (every worker's shard)
    T = rewards.shape[1]
    next_value = torch.zeros_like(rewards[:, 0])
    last = torch.zeros_like(rewards[:, 0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        # padding after EOS keeps the later values out of the recursion
        last = last * mask[:, t]
        next_value = values[:, t] * mask[:, t]
        adv[:, t] = last
    returns = adv + values
    return masked_whiten(adv, mask, allreduce) * mask, returns


@register("gae", needs_critic=True)
def compute(x: AdvantageInput):
    return gae_advantages(x.token_rewards, x.values, x.mask, x.gamma, x.lam, x.allreduce)
