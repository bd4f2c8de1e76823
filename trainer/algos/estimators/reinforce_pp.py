"""REINFORCE++: discounted returns whitened over the whole batch, no critic."""

from __future__ import annotations

import torch

from ..core_algos import AllReduce, local, masked_whiten
from .registry import AdvantageInput, register


def reinforce_pp_advantages(token_rewards, mask, gamma: float, allreduce: AllReduce = local):
    """(advantages, returns), both [B, R]."""
    # G_t = r_t + gamma * G_{t+1} over the tokens the model wrote (m_t = 1); a token it did not write (an
    # observation, padding) has G_t = 0 and passes G_{t+1} through unchanged ; A = whiten(G) over the whole batch
    # (every worker's shard)
    T = token_rewards.shape[1]
    ret = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(T)):
        m = mask[:, t]
        new = token_rewards[:, t] + gamma * running
        ret[:, t] = new * m
        running = new * m + running * (1 - m)
    return masked_whiten(ret, mask, allreduce) * mask, ret


@register("reinforce_plus_plus")
def compute(x: AdvantageInput):
    """`reinforce_plus_plus`: the token rewards discounted by algorithm.gamma."""
    return reinforce_pp_advantages(x.token_rewards, x.mask, x.gamma, x.allreduce)
