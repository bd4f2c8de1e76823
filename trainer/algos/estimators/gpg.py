"""GPG's estimator: group-centred scores scaled by the batch's share of non-zero scores."""

from __future__ import annotations

import torch

from ..core_algos import AllReduce, local
from .groups import group_centred
from .registry import AdvantageInput, register


def gpg_advantages(scores, mask, index, allreduce: AllReduce = local, f_norm: float = 1.0):
    """(advantages, the same as returns), both [B, R]: each sample's score [B] against its group (index), scaled
    by the whole batch's count of non-zero scores."""
    # alpha = B / max(1, #{i: s_i != 0}) over the whole batch ; A_i = alpha (s_i - mean(s_group)) / f_norm
    counts = allreduce(
        torch.stack(
            [
                torch.tensor(float(len(scores)), device=scores.device),
                torch.count_nonzero(scores).to(scores.device, torch.float32),
            ]
        ).double()
    )
    alpha = (counts[0] / counts[1].clamp_min(1)).to(scores.dtype)
    adv = alpha * group_centred(scores, index) / f_norm
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("gpg")
def compute(x: AdvantageInput):
    """`gpg`: each response's summed token rewards as its score."""
    return gpg_advantages(x.token_rewards.sum(-1), x.mask, x.index, x.allreduce)
