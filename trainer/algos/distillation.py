"""On-policy distillation's loss, as verl 0.9 computes it (verl/trainer/distillation/losses.py): the student's own
samples, scored token by token against a teacher's log-probs of the same tokens.

Per token, an estimator of the reverse KL(student || teacher) from the sampled token alone (verl's kl_penalty, the
same estimators as the KL loss: k1 = log s - log t, abs, k2 = (log s - log t)^2 / 2, k3 = t/s - log(t/s) - 1),
clamped to [-loss_max_clamp, loss_max_clamp] where set. Then either
- a direct loss (https://arxiv.org/abs/2306.13649): the per-token values aggregated by actor.loss_agg_mode and
  backpropagated (k1 is refused there: its gradient does not depend on the teacher), or
- a policy gradient (use_policy_gradient, https://thinkingmachines.ai/blog/on-policy-distillation/): the negated,
  detached per-token values as the advantages of PPO's clipped surrogate (vanilla, with distillation_loss's own
  clip ratios and verl's default clip_ratio_c of 3).
The actor's loss is the task's PPO loss plus distillation_loss_coef times this one (use_task_rewards), or this one
alone (coefficient 1, no policy, entropy or KL loss), as verl's distillation_ppo_loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .core_algos import agg_loss, kl_penalty, masked_mean
from .policy_losses.vanilla import clipped_surrogate, dual_clip_fraction

# verl 0.9's estimator modes (DistillationLossSettings use_estimator): the sampled token's log-prob is all they need
ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# its top-k modes, which need the teacher's top-k distribution at every position
TOPK_MODES = ("forward_kl_topk",)
CLIP_RATIO_C = 3.0  # verl's vanilla loss reads config.get("clip_ratio_c", 3.0); distillation_loss has no such key


@dataclass(frozen=True)
class DistillationLoss:
    """distillation.distillation_loss.* as the update reads them (DistillationLoss.of(cfg))."""

    loss_mode: str
    coef: float  # distillation_loss_coef with task rewards; 1 without, as verl
    max_clamp: float | None
    use_policy_gradient: bool
    use_task_rewards: bool
    clip_low: float
    clip_high: float

    @classmethod
    def of(cls, cfg) -> DistillationLoss | None:
        """None where distillation is off."""
        d = cfg.distillation
        if not d.enabled:
            return None
        lc = d.distillation_loss
        coef = lc.distillation_loss_coef if lc.use_task_rewards else 1.0
        args = (lc.loss_max_clamp, lc.use_policy_gradient, lc.use_task_rewards, lc.clip_ratio_low, lc.clip_ratio_high)
        return cls(lc.loss_mode, coef, *args)


def token_losses(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mode: str) -> torch.Tensor:
    """[B, R] per-token estimates of KL(student || teacher) (verl's compute_distillation_loss_reverse_kl_estimator)."""
    return kl_penalty(student_logp, teacher_logp, mode)


def distillation_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    cfg: DistillationLoss,
    agg,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the micro batch's distillation loss, its metrics under verl's names) for [B, R] log-probs. `agg`: the
    actor's loss aggregation (a mode, or core_algos.Agg with the global mini batch). `is_weights`: rollout
    correction's, which verl passes to the policy-gradient form."""
    losses = token_losses(logp, teacher_logp, cfg.loss_mode)
    kept = mask.bool()
    # verl's loss_min/max: over the micro batch's response tokens, before the clamp; abs_loss: their mean |value|
    chosen = losses.detach()[kept]
    empty = chosen.numel() == 0
    metrics = {
        "distillation/abs_loss": masked_mean(losses.detach().abs(), mask),
        "distillation/loss_min": losses.new_zeros(()) if empty else chosen.min(),
        "distillation/loss_max": losses.new_zeros(()) if empty else chosen.max(),
    }
    if cfg.max_clamp is not None:  # both ways: k1 can be negative
        losses = losses.clamp(-cfg.max_clamp, cfg.max_clamp)
    if not cfg.use_policy_gradient:
        return agg_loss(losses, mask, agg), metrics
    adv = -losses.detach()
    args = (cfg.clip_low, cfg.clip_high, CLIP_RATIO_C)
    loss, clipfrac, ppo_kl = clipped_surrogate(old_logp, logp, adv, mask, *args, agg, is_weights)
    lower = dual_clip_fraction(old_logp.detach(), logp.detach(), adv, mask, *args)
    metrics |= {"distillation/pg_clipfrac": clipfrac, "distillation/ppo_kl": ppo_kl}
    metrics["distillation/pg_clipfrac_lower"] = lower
    return loss, metrics
