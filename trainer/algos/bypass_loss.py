"""verl's bypass mode (algorithm.rollout_correction.bypass_mode=True): the engine's log-probs stand as the old ones,
so the actor's old-log-prob pass is skipped, and the policy loss is verl's bypass loss whatever
actor.policy_loss.loss_mode says (verl's apply_bypass_mode and compute_policy_loss_bypass_mode). In each micro
batch it weighs the current policy against the engine (rollout_is's weights, rollout_rs's rejection, both with the
current log-probs as the training side), takes the rejected tokens out of the policy loss, and applies
loss_type's loss: PPO's clipped surrogate with ratio pi / pi_engine (ppo_clip, the weights only reported: the ratio
already corrects for the engine) or REINFORCE weighted by them (reinforce).
"""

from __future__ import annotations

import torch

from . import rollout_correction
from .core_algos import AllReduce, agg_loss, masked_mean
from .policy_losses.registry import LossFn, weighted
from .policy_losses.vanilla import vanilla

LOSS_TYPES = ("ppo_clip", "reinforce")


def reinforce(engine_logp, logp, adv, mask, agg: str, is_weights=None):
    # L = agg(-A * logp * w) (w: the detached importance weights, or 1); actor/ppo_kl = mean(engine - logp)
    loss = agg_loss(weighted(-adv * logp, is_weights), mask, agg)
    return loss, {"actor/ppo_kl": masked_mean(engine_logp - logp, mask).detach()}


def bypass_loss(rc, allreduce: AllReduce) -> LossFn:
    """The loss of a micro batch in bypass mode, for `rc` (algorithm.rollout_correction); its old log-probs are the
    engine's. `allreduce` sums over the workers for rollout_is_batch_normalize, once per micro batch."""

    def loss(engine_logp, logp, adv, mask, actor_cfg, agg: str, is_weights=None):
        # is_weights (from the batch) is None in bypass mode: the weights are computed here, against the current policy
        corr, w = {}, None
        with torch.no_grad():
            if rc.rollout_is:
                args = (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_is_batch_normalize, allreduce)
                w, m = rollout_correction.is_weights(logp, engine_logp, mask, *args)
                corr.update(m)
            if rc.rollout_rs:
                rs = (rc.rollout_rs, rc.rollout_rs_threshold)
                mask, m = rollout_correction.rejection_mask(logp, engine_logp, mask, *rs)
                corr.update(m)
        if rc.loss_type == "reinforce":
            pg, metrics = reinforce(engine_logp, logp, adv, mask, agg, w)
        else:  # ppo_clip: the weights would count the correction twice
            pg, metrics = vanilla(engine_logp, logp, adv, mask, actor_cfg, agg, None)
        return pg, {**metrics, **corr}

    return loss
