"""Pass@k GRPO (`grpo_passk`): only the best sample of each group is rewarded, by its margin over the second best."""

from __future__ import annotations

import torch

from .groups import prompt_groups
from .grpo import EPS
from .registry import AdvantageInput, register


def grpo_passk_advantages(scores, mask, index, norm_by_std: bool = True):
    """(advantages, the same as returns), both [B, R]: each group's (index) best score [B] by its margin; a
    ValueError for a group of fewer than 2 samples."""
    # A_best = (s_max - s_second) [/ (std(s_group) + eps)]; every other sample 0
    adv = torch.zeros_like(scores)
    for g, rows in prompt_groups(index, scores.device):
        if len(rows) < 2:
            raise ValueError(f"grpo_passk needs at least 2 samples per prompt; prompt {g} has {len(rows)}")
        top, at = torch.topk(scores[rows], 2)
        margin = top[0] - top[1]
        adv[rows[at[0]]] = margin / (scores[rows].std() + EPS) if norm_by_std else margin
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("grpo_passk", needs_groups=True)
def compute(x: AdvantageInput):
    """`grpo_passk`: each response's summed token rewards as its score; algorithm.norm_adv_by_std_in_grpo."""
    return grpo_passk_advantages(x.token_rewards.sum(-1), x.mask, x.index, x.norm_adv_by_std_in_grpo)
