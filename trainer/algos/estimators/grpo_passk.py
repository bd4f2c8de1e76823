"""Pass@k GRPO (`grpo_passk`): only the best sample of each group is rewarded, by its margin over the second best."""

from __future__ import annotations

import torch

from .grpo import EPS, group_ids
from .registry import AdvantageInput, register


def grpo_passk_advantages(scores, mask, index, norm_by_std: bool = True):
    # A_best = (s_max - s_second) [/ (std(s_group) + eps)]; every other sample 0
    ids = group_ids(index)
    adv = torch.zeros_like(scores)
    for g in set(ids):
        sel = [i for i, x in enumerate(ids) if x == g]
        if len(sel) < 2:
            raise ValueError(f"grpo_passk needs at least 2 samples per prompt; prompt {g} has {len(sel)}")
        top, at = torch.topk(scores[sel], 2)
        margin = top[0] - top[1]
        adv[sel[int(at[0])]] = margin / (scores[sel].std() + EPS) if norm_by_std else margin
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("grpo_passk", needs_groups=True)
def compute(x: AdvantageInput):
    return grpo_passk_advantages(x.token_rewards.sum(-1), x.mask, x.index, x.norm_adv_by_std_in_grpo)
