"""GSPO: the importance ratio of the whole sequence (geometric mean of the token ratios), clipped."""

from __future__ import annotations

import torch

from ..core_algos import Agg, agg_loss, masked_mean
from .registry import register, weighted
from .vanilla import clip_range


def gspo_loss(old_logp, logp, adv, mask, clip_low, clip_high, is_weights=None, agg: str | Agg = "token-mean"):
    """(loss, the share of tokens clipped, ppo_kl)."""
    # log s_i = mean_t (logp - old) ; token ratio s_it = exp(sg[log s_i] + logp - sg[logp]) (<= e^10) ;
    # L = max(-A s_it, -A clip(s_it, 1-lo, 1+hi)), aggregated by loss_agg_mode (verl 0.9; the paper's is
    # seq-mean-token-mean)
    diff = logp - old_logp
    seq = (diff * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    ratio = torch.exp((logp - logp.detach() + seq.detach().unsqueeze(-1)).clamp(max=10.0))
    l1, l2 = -adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = agg_loss(weighted(torch.maximum(l1, l2), is_weights), mask, agg)
    return loss, masked_mean((l2 > l1).float(), mask), masked_mean(-diff, mask)


@register("gspo")
def gspo(old_logp, logp, adv, mask, actor_cfg, agg: str | Agg, is_weights=None):
    """`gspo`: actor.clip_ratio_low and _high, aggregated by actor.loss_agg_mode."""
    loss, clipfrac, ppo_kl = gspo_loss(old_logp, logp, adv, mask, *clip_range(actor_cfg), is_weights, agg)
    # verl reports a lower clip fraction of 0 for GSPO (no dual clip)
    return loss, {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": 0.0}
