"""Clip-Cov: PPO's clipped loss, with a random few tokens of high advantage-log-prob covariance cut out of the
gradient."""

from __future__ import annotations

import torch

from ..core_algos import agg_loss, masked_mean
from .registry import register, weighted
from .vanilla import clip_range


def clip_cov_loss(old_logp, logp, adv, mask, clip_low, clip_high, ratio_k, lb, ub, agg, is_weights=None):
    """(loss, the share of tokens cut out, ppo_kl)."""
    # r = exp(logp - old); L = max(-A r, -A clip(r)); cov_t = (A - mean A)(logp - mean sg[logp]) over tokens not
    # already clipped; max(1, ratio_k * #tokens) tokens drawn at random among lb < cov < ub get L = 0
    diff = logp - old_logp
    ratio = diff.exp()
    l1, l2 = -adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    live = mask > 0
    cov = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp.detach(), mask))
    cov = cov.masked_fill(~live | ((l2 > l1) & live), -torch.inf)
    pick = torch.nonzero((cov > lb) & (cov < ub) & live)
    keep = torch.ones_like(adv)
    if len(pick):
        pick = pick[torch.randperm(len(pick))[: max(int(ratio_k * mask.sum().item()), 1)]]
        keep[pick[:, 0], pick[:, 1]] = 0
    loss = agg_loss(weighted(torch.maximum(l1, l2) * keep, is_weights), mask, agg)
    return loss, masked_mean((keep == 0).float(), mask), masked_mean(-diff, mask)


@register("clip_cov")
def clip_cov(old_logp, logp, adv, mask, actor_cfg, agg: str, is_weights=None):
    """`clip_cov`: policy_loss.clip_cov_ratio, clip_cov_lb and clip_cov_ub."""
    p = actor_cfg.policy_loss
    loss, clipfrac, ppo_kl = clip_cov_loss(
        old_logp,
        logp,
        adv,
        mask,
        *clip_range(actor_cfg),
        p.clip_cov_ratio,
        p.clip_cov_lb,
        p.clip_cov_ub,
        agg,
        is_weights,
    )
    return loss, {"actor/pg_clipfrac": clipfrac, "actor/ppo_kl": ppo_kl}
