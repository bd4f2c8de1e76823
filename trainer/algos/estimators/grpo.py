"""GRPO (and Dr.GRPO with norm_adv_by_std_in_grpo=False): each sample against its prompt's group."""

from __future__ import annotations

import torch

from .groups import prompt_groups
from .registry import AdvantageInput, register

EPS = 1e-6


def grpo_advantages(scores, mask, index, norm_by_std: bool = True):
    """(advantages, the same as returns), both [B, R]: each sample's score [B] against its group (index)."""
    # A_i = (s_i - mean(s_group)) / (std(s_group) + eps); Dr.GRPO (norm_by_std=False): A_i = s_i - mean(s_group)
    adv = torch.zeros_like(scores)
    for _, rows in prompt_groups(index, scores.device):
        s = scores[rows]
        if s.numel() == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = s.mean(), s.std()
        adv[rows] = (s - mean) / (std + EPS) if norm_by_std else s - mean
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("grpo")
def compute(x: AdvantageInput):
    """`grpo`: each response's summed token rewards as its score; algorithm.norm_adv_by_std_in_grpo."""
    return grpo_advantages(x.token_rewards.sum(-1), x.mask, x.index, x.norm_adv_by_std_in_grpo)
