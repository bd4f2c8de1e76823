"""SAPO: a smooth sigmoid gate on the token ratio instead of a hard clip (tau_pos for A > 0, tau_neg otherwise)."""

from __future__ import annotations

import torch

from ..core_algos import Agg, agg_loss, masked_mean, with_mode
from .registry import register, weighted


def sapo_loss(
    old_logp, logp, adv, mask, tau_pos: float, tau_neg: float, is_weights=None, agg: str | Agg = "seq-mean-token-mean"
):
    """(loss, ppo_kl)."""
    # r = exp(clamp(logp - old, +-20)) ; f(r) = sigmoid(tau (r - 1)) * 4 / tau ; L = -f(r) A, seq-mean-token-mean
    diff = (logp - old_logp).clamp(-20.0, 20.0)
    tau = torch.where(adv > 0, torch.as_tensor(tau_pos, dtype=adv.dtype), torch.as_tensor(tau_neg, dtype=adv.dtype))
    gate = torch.sigmoid(tau * (diff.exp() - 1.0)) * (4.0 / tau)
    loss = agg_loss(weighted(-gate * adv, is_weights), mask, with_mode(agg, "seq-mean-token-mean"))
    return loss, masked_mean(-diff, mask)


@register("sapo")
def sapo(old_logp, logp, adv, mask, actor_cfg, agg: str | Agg, is_weights=None):
    """`sapo`: actor.tau_pos and tau_neg; loss_agg_mode's mode is replaced by seq-mean-token-mean."""
    loss, ppo_kl = sapo_loss(old_logp, logp, adv, mask, actor_cfg.tau_pos, actor_cfg.tau_neg, is_weights, agg)
    # verl reports both clip fractions as 0 for SAPO (a gate, no clip)
    return loss, {"actor/ppo_kl": ppo_kl, "actor/pg_clipfrac": 0.0, "actor/pg_clipfrac_lower": 0.0}
