"""GDPO (group reward-decoupled normalization, https://arxiv.org/abs/2601.05242): each reward component GRPO-normalized
within its prompt's group on its own, the weighted sum then whitened over the whole batch, as verl 0.9's
compute_gdpo_outcome_advantage."""

from __future__ import annotations

import torch

from ..core_algos import AllReduce, local, masked_whiten
from .grpo import grpo_advantages
from .registry import AdvantageInput, register


def gdpo_advantages(
    components: torch.Tensor,
    mask: torch.Tensor,
    index,
    weights=None,
    norm_by_std: bool = True,
    allreduce: AllReduce = local,
):
    """(advantages, the same as returns), both [B, R], from each sample's K reward components [B, K] (`weights`: K
    numbers, None: all 1)."""
    # A_k = GRPO(r_k) within each group; A = whiten(sum_k w_k A_k) over the whole batch's response tokens
    k = components.shape[1]
    w = [1.0] * k if weights is None else list(weights)
    total = sum(w[i] * grpo_advantages(components[:, i], mask, index, norm_by_std)[0] for i in range(k))
    adv = masked_whiten(total, mask, allreduce) * mask
    return adv, adv


@register("gdpo", needs_reward_components=True)
def compute(x: AdvantageInput):
    """`gdpo`: algorithm.gdpo_reward_keys, the reward function's fields each sample is scored by (x.components, in
    that order), weighed by algorithm.gdpo_reward_weights; the token rewards (and a KL penalty in them) are not read,
    as in verl."""
    return gdpo_advantages(x.components, x.mask, x.index, x.component_weights, x.norm_adv_by_std_in_grpo, x.allreduce)
