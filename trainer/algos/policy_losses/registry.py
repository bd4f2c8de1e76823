"""Policy losses by name (`actor_rollout_ref.actor.policy_loss.loss_mode`), as verl's `register_policy_loss`.

A loss takes the old and new log-probs, the advantages and the response mask ([B, R] each), the
actor's config and the aggregation mode, and returns the scalar loss and its metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# (old_logp, logp, advantages, mask, actor config, loss_agg_mode, is_weights) -> (loss, {"actor/pg_clipfrac": ...,
# ...}); is_weights: rollout correction's [B, R] importance weights (algos/rollout_correction.py) or None, multiplying
# each token's loss before aggregation, as verl's losses take rollout_is_weights
LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered loss: loss_mode's name and its function (LossFn)."""

    name: str
    fn: LossFn


POLICY_LOSSES: dict[str, PolicyLoss] = {}


def weighted(per_token: torch.Tensor, is_weights: torch.Tensor | None) -> torch.Tensor:
    """Each token's loss times its rollout-correction weight, where there are weights: before aggregation."""
    return per_token if is_weights is None else per_token * is_weights


def register(name: str):
    """Registers `fn` (a LossFn: (old_logp, logp, advantages, mask, actor config, loss_agg_mode, is_weights) ->
    (scalar loss, metrics)) as policy_loss.loss_mode=`name`. The loss aggregates over the mask by loss_agg_mode
    (core_algos.agg_loss), multiplies each token's loss by is_weights where given (weighted), and names its metrics
    as verl's (actor/pg_clipfrac, actor/ppo_kl, ...). A name registered twice is a ValueError."""

    def deco(fn):
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is registered twice")
        POLICY_LOSSES[name] = PolicyLoss(name, fn)
        return fn

    return deco
