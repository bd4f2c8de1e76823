"""OPO: each score minus its prompt's length-weighted mean score (the optimal baseline for outcome rewards)."""

from __future__ import annotations

from .grpo import group_ids
from .registry import AdvantageInput, register


def opo_advantages(scores, mask, index):
    # b_group = sum_j |y_j| s_j / sum_j |y_j| ; A_i = s_i - b_group (0 baseline for a group of one)
    ids = group_ids(index)
    lengths = mask.sum(-1)
    adv = scores.clone()
    for g in set(ids):
        sel = [i for i, x in enumerate(ids) if x == g]
        if len(sel) > 1:
            adv[sel] = scores[sel] - (lengths[sel] * scores[sel]).sum() / lengths[sel].sum()
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("opo")
def compute(x: AdvantageInput):
    return opo_advantages(x.token_rewards.sum(-1), x.mask, x.index)
