"""GMPO (`geo_mean`): the geometric mean of the token ratios, each clipped in log space, per sequence."""

from __future__ import annotations

import torch

from ..core_algos import masked_mean
from .registry import register
from .vanilla import clip_range


def geo_mean_loss(old_logp, logp, adv, mask, clip_low, clip_high, is_weights=None):
    """(loss, the share of tokens clipped with A > 0, with A < 0, ppo_kl); the loss is a mean over sequences, so
    loss_agg_mode does not apply."""
    # d = logp - old ; d' = sgn(A) min(sgn(A) d, sgn(A) clip(d, -lo, hi)) ;
    # r_i = exp(mean_t d') ; A_i = mean_t A ; L = mean_i(-A_i r_i)
    d = logp - old_logp
    sgn = torch.sign(adv)
    dc = d.clamp(-clip_low, clip_high)
    d_min = sgn * torch.minimum(sgn * d, sgn * dc)
    n = mask.sum(-1)
    ratio = torch.exp((d_min * mask).sum(-1) / (n + 1e-8))
    seq_adv = (adv * mask).sum(-1) / (n + 1e-8)
    clipped = (d != dc).float()
    if is_weights is not None:  # token weights to one per sequence, by their geometric mean: w_i = exp(mean_t log w_t)
        ratio = ratio * torch.exp((torch.log(is_weights + 1e-10) * mask).sum(-1) / (n + 1e-8))
    return (
        (-seq_adv * ratio).mean(),
        masked_mean(clipped * (adv > 0), mask),
        masked_mean(clipped * (adv < 0), mask),
        masked_mean(-d, mask),
    )


@register("geo_mean")
def geo_mean(old_logp, logp, adv, mask, actor_cfg, agg: str, is_weights=None):
    """`geo_mean`: actor.clip_ratio_low and _high, in log space."""
    loss, upper, lower, ppo_kl = geo_mean_loss(old_logp, logp, adv, mask, *clip_range(actor_cfg), is_weights)
    return loss, {"actor/pg_clipfrac": upper, "actor/pg_clipfrac_lower": lower, "actor/ppo_kl": ppo_kl}
