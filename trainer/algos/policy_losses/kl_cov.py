"""KL-Cov: the plain ratio loss, with a |log ratio| penalty on the tokens of highest advantage-log-prob covariance."""

from __future__ import annotations

import torch

from ..core_algos import agg_loss, masked_mean
from .registry import register, weighted


def kl_cov_loss(old_logp, logp, adv, mask, ratio_k, kl_coef, agg, is_weights=None):
    """(loss, ppo_kl as the mean |logp - old|)."""
    # r = exp(logp - old); L = -A r, and on the top max(1, ratio_k * #tokens) tokens by (A - mean A)(logp - mean logp):
    # L = -A r + kl_coef |logp - old|
    diff = logp - old_logp
    ratio = diff.exp()
    loss = -adv * ratio
    live = torch.nonzero(mask.reshape(-1) > 0, as_tuple=True)[0]
    if len(live):
        a, lp = adv.reshape(-1)[live].detach(), logp.reshape(-1)[live].detach()
        cov = (a - a.mean()) * (lp - lp.mean())
        top = live[torch.topk(cov, max(1, int(len(cov) * ratio_k))).indices]
        rows, cols = top // adv.shape[1], top % adv.shape[1]
        loss = loss.clone()
        loss[rows, cols] = loss[rows, cols] + kl_coef * diff.abs()[rows, cols]
    return agg_loss(weighted(loss, is_weights), mask, agg), masked_mean(diff.abs(), mask)


@register("kl_cov")
def kl_cov(old_logp, logp, adv, mask, actor_cfg, agg: str, is_weights=None):
    """`kl_cov`: policy_loss.kl_cov_ratio and ppo_kl_coef."""
    p = actor_cfg.policy_loss
    loss, ppo_kl = kl_cov_loss(old_logp, logp, adv, mask, p.kl_cov_ratio, p.ppo_kl_coef, agg, is_weights)
    return loss, {"actor/ppo_kl": ppo_kl}
