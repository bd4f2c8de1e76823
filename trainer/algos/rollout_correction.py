"""verl's rollout correction (algorithm.rollout_correction.rollout_is): truncated importance weights between the
policy that trained (the actor's old log-probs) and the engine that sampled (vLLM's or SGLang's own log-probs),
which multiply each token's policy loss. Engines differ from the actor in kernels and precision, so the
tokens were drawn from a slightly different distribution than the one the update assumes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .core_algos import masked_mean

SAFETY_BOUND = 20.0  # verl's clamp on a log ratio before exp


def is_weights(
    old_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    mask: torch.Tensor,
    level: str,
    threshold: float,
    batch_normalize: bool,
    allreduce_sum: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict]:
    """[B, R] weights (detached, 0 on padding) and verl's rollout_corr/* metrics (this worker's share).
    token:    w_t = min(exp(clamp(old_t - engine_t, +-20)), threshold)
    sequence: w_t = min(exp(clamp(sum_t (old_t - engine_t), +-20)), threshold) for every token of the sequence
    batch_normalize: w / mean(w), the mean over every worker's tokens (token) or sequences (sequence)."""
    log_ratio = (old_logp - engine_logp) * mask
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
        m = {
            "rollout_is_max": raw.masked_fill(mask == 0, float("-inf")).max().item(),
            "rollout_is_min": raw.masked_fill(mask == 0, float("inf")).min().item(),
            "rollout_is_ratio_fraction_high": masked_mean((raw > threshold).float(), mask).item(),
            "rollout_is_ratio_fraction_low": masked_mean((raw < 1 / threshold).float(), mask).item(),
        }
    elif level == "sequence":
        seq = log_ratio.sum(-1, keepdim=True)
        raw = torch.exp(seq.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(mask) * mask
        m = {
            "rollout_is_max": torch.exp(seq.max().clamp(max=SAFETY_BOUND)).item(),
            "rollout_is_min": torch.exp(seq.min()).item(),
            "rollout_is_ratio_fraction_high": (seq > torch.log(torch.tensor(threshold))).float().mean().item(),
            "rollout_is_ratio_fraction_low": (seq < -torch.log(torch.tensor(threshold))).float().mean().item(),
        }
    else:
        raise ValueError(f"rollout_is={level!r}: token or sequence")
    m["rollout_is_mean"] = masked_mean(raw, mask).item()  # before truncation, as verl reports it
    w = raw.clamp(max=threshold).detach()
    if batch_normalize:
        if level == "token":
            total = allreduce_sum(torch.stack([(w * mask).sum(), mask.sum().to(w.dtype)]))
        else:  # one weight per sequence that has tokens
            live = (mask.sum(-1) > 0).to(w.dtype)
            per_seq = (w * mask).sum(-1) / mask.sum(-1).clamp_min(1)
            total = allreduce_sum(torch.stack([(per_seq * live).sum(), live.sum()]))
        mean = total[0] / total[1].clamp_min(1e-8)
        if mean > 1e-8:
            w = w / mean
        m["rollout_is_batch_norm_factor"] = mean.item() if mean > 1e-8 else 1.0
    return w, {f"rollout_corr/{k}": v for k, v in m.items()}
