"""OPO: each score minus its prompt's length-weighted mean score (the optimal baseline for outcome rewards)."""

from __future__ import annotations

from .groups import prompt_groups
from .registry import AdvantageInput, register


def opo_advantages(scores, mask, index):
    """(advantages, the same as returns), both [B, R]: each sample's score [B] against its group (index), the
    group's responses weighted by their lengths (mask)."""
    # b_group = sum_j |y_j| s_j / sum_j |y_j| ; A_i = s_i - b_group (0 baseline for a group of one)
    lengths = mask.sum(-1)
    adv = scores.clone()
    for _, rows in prompt_groups(index, scores.device):
        if len(rows) > 1:
            adv[rows] = scores[rows] - (lengths[rows] * scores[rows]).sum() / lengths[rows].sum()
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("opo")
def compute(x: AdvantageInput):
    """`opo`: each response's summed token rewards as its score."""
    return opo_advantages(x.token_rewards.sum(-1), x.mask, x.index)
