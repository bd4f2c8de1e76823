"""RLOO: each sample against the mean of the other samples of its prompt."""

from __future__ import annotations

import torch

from .groups import prompt_groups
from .registry import AdvantageInput, register


def rloo_advantages(scores, mask, index):
    """(advantages, the same as returns), both [B, R]: each sample's score [B] against its group (index)."""
    # A_i = s_i * n/(n-1) - mean(s_group) * n/(n-1)  ==  s_i - mean of the other n-1 samples
    adv = torch.zeros_like(scores)
    for _, rows in prompt_groups(index, scores.device):
        s = scores[rows]
        n = s.numel()
        adv[rows] = s * n / (n - 1) - s.mean() * n / (n - 1) if n > 1 else s
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("rloo")
def compute(x: AdvantageInput):
    """`rloo`: each response's summed token rewards as its score."""
    return rloo_advantages(x.token_rewards.sum(-1), x.mask, x.index)
