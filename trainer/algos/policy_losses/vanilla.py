"""PPO's clipped surrogate with dual clip (verl's `vanilla`)."""

from __future__ import annotations

import torch

from ..core_algos import agg_loss, masked_mean
from .registry import register, weighted


def clipped_surrogate(
    old_logp, logp, adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0, agg="token-mean", is_weights=None
):
    """(loss, the share of tokens clipped, ppo_kl)."""
    # r = exp(clamp(logp - old, +-20)); L = max(-A r, -A clip(r, 1-lo, 1+hi)); for A<0 also min(L, -A c) (dual clip)
    diff = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = diff.exp()
    ppo_kl = masked_mean(-diff, mask)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    clipped = torch.maximum(l1, l2)
    clipfrac = masked_mean((l2 > l1).float(), mask)
    l3 = -adv * clip_c
    dual = torch.minimum(l3, clipped)
    loss = weighted(torch.where(adv < 0, dual, clipped), is_weights)
    return agg_loss(loss, mask, agg), clipfrac, ppo_kl


def clip_range(actor_cfg) -> tuple[float, float]:
    """(low, high): actor.clip_ratio_low and clip_ratio_high, each actor.clip_ratio where unset."""
    lo = actor_cfg.clip_ratio_low if actor_cfg.clip_ratio_low is not None else actor_cfg.clip_ratio
    hi = actor_cfg.clip_ratio_high if actor_cfg.clip_ratio_high is not None else actor_cfg.clip_ratio
    return lo, hi


def dual_clip_fraction(old_logp, logp, adv, mask, clip_low, clip_high, clip_c):
    """The share of tokens where the dual clip bound -A c is the one that applies (A < 0, ratio large)."""
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    clipped = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))
    return masked_mean(((clipped > -adv * clip_c) & (adv < 0)).float(), mask)


@register("vanilla")
def vanilla(old_logp, logp, adv, mask, actor_cfg, agg: str, is_weights=None):
    """`vanilla` (verl's default): actor.clip_ratio_low, _high and clip_ratio_c."""
    lo, hi = clip_range(actor_cfg)
    loss, clipfrac, ppo_kl = clipped_surrogate(
        old_logp, logp, adv, mask, lo, hi, actor_cfg.clip_ratio_c, agg, is_weights
    )
    lower = dual_clip_fraction(old_logp.detach(), logp.detach(), adv, mask, lo, hi, actor_cfg.clip_ratio_c)
    return loss, {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl, "actor/pg_clipfrac_lower": lower}
