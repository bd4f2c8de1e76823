"""verl's rollout correction (algorithm.rollout_correction.*) between the policy that trains (the actor's old
log-probs) and the engine that sampled (vLLM's or SGLang's own log-probs): truncated importance weights
(rollout_is), which multiply each token's policy loss, and rejection sampling (rollout_rs), which takes tokens or
whole sequences out of the loss. Engines differ from the actor in kernels and precision, so the tokens were drawn
from a slightly different distribution than the one the update assumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .core_algos import masked_mean

SAFETY_BOUND = 20.0  # verl's clamp on a log ratio before exp

# verl's rollout_rs options (rollout_corr_helper.py SUPPORTED_ROLLOUT_RS_OPTIONS): the divergence k1, k2 or k3 per
# token, or its sum, mean or max over each sequence
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


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


def rs_options(spec) -> list[str]:
    """verl's rollout_rs: one option or several, comma-separated (a token stays only if it passes every one),
    duplicates dropped."""
    options = list(dict.fromkeys(o.strip() for o in str(spec).split(",") if o.strip()))
    bad = [o for o in options if o not in RS_OPTIONS]
    if not options or bad:
        raise ValueError(f"{bad[0] if bad else spec!r} is not one of {', '.join(RS_OPTIONS)}")
    return options


def rs_thresholds(options: list[str], spec) -> dict[str, tuple[float | None, float]]:
    """Each option's (lower, upper) bound from verl's rollout_rs_threshold: one entry shared by every option or one
    per option, comma-separated. A k1 option bounds a ratio: `lower_upper`, or the upper bound alone with its
    reciprocal as the lower; k2 and k3 bound a divergence from above only (lower None). Every bound is above 0."""
    if spec is None:
        raise ValueError("rejection sampling needs a threshold")
    specs = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(specs) not in (1, len(options)):
        raise ValueError(f"give one threshold for all {len(options)} options or one for each, not {len(specs)}")
    bounds = {}
    for option, text in zip(options, specs * len(options) if len(specs) == 1 else specs):
        k1 = option.endswith("k1")
        if "_" in text and not k1:
            raise ValueError(f"{option} takes one upper bound, not {text!r}")
        lower_text, upper_text = text.split("_", 1) if "_" in text else (None, text)
        try:
            upper = float(upper_text)
            lower = float(lower_text) if lower_text is not None else (1.0 / upper if k1 else None)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{text!r} for {option} is not a number{' or lower_upper' if k1 else ''}") from None
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"the bounds of {option} must be above 0, not {text!r}")
        bounds[option] = (lower, upper)
    return bounds


def _row_sum(x: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    return torch.where(live, x, 0.0).sum(-1)


def _row_mean(x: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    return _row_sum(x, live) / live.sum(-1).clamp_min(1e-8)


def _row_max(x: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    top = x.masked_fill(~live, float("-inf")).max(-1).values
    return torch.where(top == float("-inf"), 0.0, top)  # a row without tokens: 0


SEQ_STATS = {"seq_sum": _row_sum, "seq_mean": _row_mean, "seq_max": _row_max}


def rejection_mask(
    old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor, rollout_rs: str, rollout_rs_threshold
) -> tuple[torch.Tensor, dict]:
    """verl's rejection sampling: the [B, R] mask with what fails an option's bounds set to 0, and verl's
    rollout_corr/rollout_rs_* metrics (this worker's share). With r_t = clamp(old_t - engine_t, +-20) the divergences
    of a token are k1 = -r_t, k2 = r_t^2 / 2, k3 = exp(r_t) - 1 - r_t; token_kX keeps a token whose kX is within
    bounds, seq_{sum,mean,max}_kX a sequence whose sum, mean or max of kX over its tokens is (all its tokens, or
    none). Within bounds: log(lower) <= stat <= log(upper) for k1, stat <= upper for k2 and k3."""
    options = rs_options(rollout_rs)
    bounds = rs_thresholds(options, rollout_rs_threshold)
    live = mask.bool()
    if not live.any():
        return mask, {}
    r = torch.where(live, old_logp - engine_logp, 0.0).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # padding counts nowhere
    k = {"k1": -r, "k2": 0.5 * r**2, "k3": torch.exp(r) - 1.0 - r}
    m, seq_live = mask.to(r.dtype), live.any(-1)
    keep_all = torch.ones_like(r)
    out = {}
    for option in options:
        level, kind = option.rsplit("_", 1)
        lower, upper = bounds[option]
        hi, lo = (math.log(upper), math.log(lower)) if kind == "k1" else (upper, None)
        seq = None if level == "token" else SEQ_STATS[level](k[kind], live)
        stat = k[kind] if seq is None else seq.unsqueeze(-1).expand_as(r)
        keep = (stat <= hi) if lo is None else (stat >= lo) & (stat <= hi)
        keep_all = keep_all * keep.to(r.dtype)
        out.update(_rs_option_metrics(f"rollout_rs_{option}", stat, seq, m, live, seq_live, lo, hi))
        seq_kept = ~(~keep & live).any(-1)
        out[f"rollout_rs_{option}_masked_fraction"] = masked_mean(1.0 - keep.to(r.dtype), m).item()
        out[f"rollout_rs_{option}_seq_masked_fraction"] = ((~seq_kept & seq_live).sum() / seq_live.sum()).item()
    out["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep_all, m).item()
    out["rollout_rs_seq_masked_fraction"] = (~(keep_all > 0.5) & live).any(-1).float().mean().item()  # of all rows
    return (mask * keep_all).to(mask.dtype), {f"rollout_corr/{k}": v for k, v in out.items()}


def _rs_option_metrics(p: str, stat, seq, m, live, seq_live, lo: float | None, hi: float) -> dict:
    """verl's compute_rs_metrics: the statistic's token mean, its extremes and shares beyond the bounds (over
    sequences for a sequence option, tokens for a token one), its spread, and the per-sequence values' summary (a
    token option's per sequence: its mean over the sequence's tokens)."""
    per_seq = (seq if seq is not None else _row_mean(stat, live))[seq_live]
    f = lambda b: b.float().mean().item()  # noqa: E731
    out = {f"{p}_mean": masked_mean(stat, m).item()}
    if seq is not None:
        out.update({f"{p}_max": per_seq.max().item(), f"{p}_min": per_seq.min().item()})
        out.update({f"{p}_fraction_high": f(per_seq > hi), f"{p}_fraction_low": 0.0 if lo is None else f(per_seq < lo)})
    else:
        out[f"{p}_max"] = stat.masked_fill(~live, float("-inf")).max().item()
        out[f"{p}_min"] = stat.masked_fill(~live, float("inf")).min().item()
        out[f"{p}_fraction_high"] = masked_mean((stat > hi).float(), m).item()
        out[f"{p}_fraction_low"] = 0.0 if lo is None else masked_mean((stat < lo).float(), m).item()
    # std of the statistic clamped to [lower (0 without one), upper]: sqrt(max(E[s^2] - E[s]^2, 0)), over 2+ tokens
    s = stat.clamp(min=0.0 if lo is None else lo, max=hi)
    var = masked_mean(s.square(), m) - masked_mean(s, m).square()
    out[f"{p}_std"] = var.clamp(min=0.0).sqrt().item() if m.sum() > 1 else 0.0
    out[f"{p}_seq_mean"] = per_seq.mean().item()
    out[f"{p}_seq_std"] = per_seq.std().item() if per_seq.numel() > 1 else 0.0
    out[f"{p}_seq_max"] = per_seq.max().item()
    out[f"{p}_seq_min"] = per_seq.min().item()
    out[f"{p}_seq_max_deviation"] = per_seq.abs().max().item()
    out[f"{p}_seq_fraction_high"] = f(per_seq > hi)
    if lo is not None:
        out[f"{p}_seq_fraction_low"] = f(per_seq < lo)
    return out
