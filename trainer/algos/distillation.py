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
The top-k mode (forward_kl_topk, verl's fsdp/losses.py compute_forward_kl_topk) reads the teacher's k likeliest
tokens at each position instead of the sampled one: with t_j, s_j the teacher's and the student's log-probs of the
teacher's top-k tokens j (each clamped below at log_prob_min_clamp where set),

    loss = max(0, sum_j exp(t_j) (t_j - s_j))      (forward KL(teacher || student) over the top k; >= 0 only
                                                     over the whole vocabulary, hence verl's max with 0)

then the same loss_max_clamp and the same two forms. Its metrics: the probability mass each side puts on the
teacher's top k (student_mass, teacher_mass, before the clamp), and how far the student's own top k overlaps the
teacher's (overlap_ratio, and overlap_token_advantage: the mean of -exp(t_j) (t_j - s_j) over the overlapping
tokens of the positions with any).
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
    """distillation.distillation_loss.* as the update reads them (DistillationLoss.of(cfg)). `topk` and
    `min_clamp` are read by the top-k mode only."""

    loss_mode: str
    coef: float  # distillation_loss_coef with task rewards; 1 without, as verl
    max_clamp: float | None
    use_policy_gradient: bool
    use_task_rewards: bool
    clip_low: float
    clip_high: float
    topk: int | None = None
    min_clamp: float | None = None

    @property
    def uses_topk(self) -> bool:
        return self.loss_mode in TOPK_MODES

    @classmethod
    def of(cls, cfg) -> DistillationLoss | None:
        """None where distillation is off."""
        d = cfg.distillation
        if not d.enabled:
            return None
        lc = d.distillation_loss
        coef = lc.distillation_loss_coef if lc.use_task_rewards else 1.0
        args = (lc.loss_max_clamp, lc.use_policy_gradient, lc.use_task_rewards, lc.clip_ratio_low, lc.clip_ratio_high)
        return cls(lc.loss_mode, coef, *args, lc.topk, lc.log_prob_min_clamp)


@dataclass(frozen=True)
class StudentTopK:
    """The student's side of the top-k mode for [B, R] positions: its log-probs of the teacher's top-k tokens
    [B, R, K] (with their gradient) and the ids of its own k likeliest tokens [B, R, K]."""

    logp: torch.Tensor
    own_ids: torch.Tensor


def topk_token_losses(
    student: StudentTopK, teacher_logp: torch.Tensor, teacher_ids: torch.Tensor, min_clamp: float | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """[B, R] forward KL(teacher || student) over the teacher's top k, before verl's max with 0, and the per-token
    [B, R] statistics verl's metrics read (student_mass, teacher_mass, overlap_count, overlap_token_advantage): verl's
    compute_forward_kl_topk (fsdp/losses.py): the divergence in fp32, the statistics in the inputs' dtype."""
    s, t = student.logp, teacher_logp
    stats = {"student_mass": s.detach().exp().sum(-1), "teacher_mass": t.exp().sum(-1)}
    if min_clamp is not None:
        s, t = s.clamp_min(min_clamp), t.clamp_min(min_clamp)
    kl = (t.float().exp() * (t.float() - s.float())).sum(-1)
    overlap = (teacher_ids.unsqueeze(-1) == student.own_ids.unsqueeze(-2)).any(-1)
    count = overlap.sum(-1)
    token_kl = t.exp() * (t - s.detach())
    advantage = (-token_kl * overlap).sum(-1) / count.clamp_min(1)
    stats["overlap_count"] = count
    stats["overlap_token_advantage"] = torch.where(count > 0, advantage, torch.zeros_like(advantage))
    return kl, stats


def topk_metrics(stats: dict[str, torch.Tensor], mask: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """verl's forward_kl_topk metrics over the micro batch's response tokens (0 where it has none)."""
    kept = mask.bool()
    zero = mask.new_zeros(())
    if not kept.any():
        names = ("student_mass", "teacher_mass")
        out = {f"distillation/{n}{x}": zero for n in names for x in ("", "_min", "_max")}
        return out | {"distillation/overlap_ratio": zero, "distillation/overlap_token_advantage": zero}
    out = {}
    for name in ("student_mass", "teacher_mass"):
        v = stats[name][kept]
        out |= {f"distillation/{name}": v.mean(), f"distillation/{name}_min": v.min()}
        out[f"distillation/{name}_max"] = v.max()
    out["distillation/overlap_ratio"] = stats["overlap_count"][kept].float().mean() / k
    at = kept & (stats["overlap_count"] > 0)
    adv = stats["overlap_token_advantage"]
    out["distillation/overlap_token_advantage"] = adv[at].mean() if at.any() else zero
    return out


def token_losses(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mode: str) -> torch.Tensor:
    """[B, R] per-token estimates of KL(student || teacher) (verl's compute_distillation_loss_reverse_kl_estimator)."""
    return kl_penalty(student_logp, teacher_logp, mode)


def distillation_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    teacher: tuple[torch.Tensor, torch.Tensor | None],
    mask: torch.Tensor,
    cfg: DistillationLoss,
    agg,
    is_weights: torch.Tensor | None = None,
    student: StudentTopK | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the micro batch's distillation loss, its metrics under verl's names) for [B, R] log-probs. `teacher`: its
    log-probs of the sampled tokens [B, R] and None, or, in the top-k mode, of its top-k tokens [B, R, K] and their
    ids [B, R, K], whose student side is `student`. `agg`: the actor's loss aggregation (a mode, or core_algos.Agg
    with the global mini batch). `is_weights`: rollout correction's, which verl passes to the policy-gradient
    form."""
    teacher_logp, teacher_ids = teacher
    if cfg.uses_topk:
        losses, stats = topk_token_losses(student, teacher_logp, teacher_ids, cfg.min_clamp)
        losses = losses.clamp_min(0.0)  # over the top k only, the divergence can be negative
        metrics = topk_metrics(stats, mask, teacher_ids.shape[-1])
    else:
        losses = token_losses(logp, teacher_logp, cfg.loss_mode)
        metrics = {"distillation/abs_loss": masked_mean(losses.detach().abs(), mask)}
    # verl's loss_min/max: over the micro batch's response tokens, before the clamp
    chosen = losses.detach()[mask.bool()]
    empty = chosen.numel() == 0
    metrics["distillation/loss_min"] = losses.new_zeros(()) if empty else chosen.min()
    metrics["distillation/loss_max"] = losses.new_zeros(()) if empty else chosen.max()
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
