"""RLOO: each sample against the mean of the other samples of its prompt."""

from __future__ import annotations

import torch

from .grpo import group_ids
from .registry import AdvantageInput, register


def rloo_advantages(scores, mask, index):
    # A_i = s_i * n/(n-1) - mean(s_group) * n/(n-1)  ==  s_i - mean of the other n-1 samples
    ids = group_ids(index)
    adv = torch.zeros_like(scores)
    for g in set(ids):
        sel = torch.tensor([i == g for i in ids], device=scores.device)
        s = scores[sel]
        n = s.numel()
        adv[sel] = s * n / (n - 1) - s.mean() * n / (n - 1) if n > 1 else s
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("rloo")
def compute(x: AdvantageInput):
    return rloo_advantages(x.token_rewards.sum(-1), x.mask, x.index)
