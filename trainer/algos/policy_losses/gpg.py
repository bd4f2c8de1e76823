"""GPG's loss: plain policy gradient, -log p(y) A, no ratio and no clip."""

from __future__ import annotations

from ..core_algos import agg_loss
from .registry import register, weighted


@register("gpg")
def gpg(old_logp, logp, adv, mask, actor_cfg, agg: str, is_weights=None):
    """`gpg`: no metrics of its own."""
    # L = -logp A
    return agg_loss(weighted(-logp * adv, is_weights), mask, agg), {}
