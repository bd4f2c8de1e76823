"""REINFORCE++ with a group baseline (`reinforce_plus_plus_baseline`): each score minus its prompt's
mean, then whitened over the whole batch."""

from __future__ import annotations

from ..core_algos import AllReduce, local, masked_whiten
from .groups import group_centred
from .registry import AdvantageInput, register


def reinforce_pp_baseline_advantages(scores, mask, index, allreduce: AllReduce = local):
    """(advantages, advantages as the returns), both [B, R], from each sample's score [B] and group id."""
    # s_i - mean(s_group) (0 for a group of one), on every response token, then whitened over the whole batch
    tokens = group_centred(scores, index).unsqueeze(-1) * mask
    adv = masked_whiten(tokens, mask, allreduce) * mask
    return adv, adv


@register("reinforce_plus_plus_baseline")
def compute(x: AdvantageInput):
    """`reinforce_plus_plus_baseline`: each response's summed token rewards as its score."""
    return reinforce_pp_baseline_advantages(x.token_rewards.sum(-1), x.mask, x.index, x.allreduce)
