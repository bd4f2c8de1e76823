"""CISPO: the clipped importance ratio as a stopped-gradient weight on -log p(y) A."""

from __future__ import annotations

from ..core_algos import agg_loss, masked_mean
from .registry import register, weighted
from .vanilla import clip_range


def cispo_loss(old_logp, logp, adv, mask, clip_low, clip_high, agg, is_weights=None):
    """(loss, the share of tokens whose ratio was clipped, ppo_kl)."""
    # r = exp(clamp(logp - old, +-20)) ; L = -sg[clip(r, 1-lo, 1+hi)] A logp
    diff = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = diff.exp()
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = agg_loss(weighted(-clipped.detach() * adv * logp, is_weights), mask, agg)
    return loss, masked_mean((ratio != clipped).float(), mask), masked_mean(-diff, mask)


@register("cispo")
def cispo(old_logp, logp, adv, mask, actor_cfg, agg: str, is_weights=None):
    """`cispo`: actor.clip_ratio_low and _high bound the weight."""
    loss, clipfrac, ppo_kl = cispo_loss(old_logp, logp, adv, mask, *clip_range(actor_cfg), agg, is_weights)
    # verl reports a lower clip fraction of 0 for CISPO (no dual clip)
    return loss, {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": 0.0}
