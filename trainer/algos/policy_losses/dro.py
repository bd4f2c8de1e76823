"""DRO's loss (Direct Reward Optimization): the policy gradient with a quadratic penalty on the log-ratio to the
old policy, no ratio and no clip, as verl 0.9's compute_policy_loss_dro."""

from __future__ import annotations

from ..core_algos import agg_loss, masked_mean
from .registry import register, weighted


@register("dro")
def dro(old_logp, logp, adv, mask, actor_cfg, agg: str, is_weights=None):
    """`dro`: policy_loss.dro_beta, positive (config validation refuses another value, as verl raises); actor/ppo_kl
    as its metric."""
    # L = -(logp A - beta/2 (logp - old_logp)^2)
    beta = actor_cfg.policy_loss.dro_beta
    log_ratio = logp - old_logp
    loss = agg_loss(weighted(-(logp * adv - 0.5 * beta * log_ratio.square()), is_weights), mask, agg)
    return loss, {"actor/ppo_kl": masked_mean(-log_ratio, mask)}
