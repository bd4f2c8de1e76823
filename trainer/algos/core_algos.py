"""The RL math as pure tensor functions. Shapes: [batch, response_len]; mask is 1 on response tokens.

Semantics follow verl's core_algos so results compare side by side.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Sums a tensor over every worker's shard (torch.distributed.all_reduce in the worker; the identity for
# one shard), so batch statistics cover the whole batch whatever the worker count.
AllReduce = Callable[[torch.Tensor], torch.Tensor]


def local(t: torch.Tensor) -> torch.Tensor:
    return t


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    # sum(x * m) / sum(m)
    return (
        (x * mask).sum(dim) / mask.sum(dim).clamp_min(1e-8)
        if dim is not None
        else (x * mask).sum() / mask.sum().clamp_min(1e-8)
    )


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, allreduce: AllReduce = local) -> torch.Tensor:
    # (x - mean) / sqrt(var + 1e-8), statistics over the masked entries of all shards (unbiased variance, as verl)
    total, n = allreduce(torch.stack([(x * mask).sum(), mask.sum()]).double())
    mean = (total / n.clamp_min(1e-8)).to(x.dtype)
    sq = allreduce((((x - mean) ** 2) * mask).sum().double())
    var = sq / n.clamp_min(1e-8) * n / (n - 1).clamp_min(1)
    return (x - mean) * torch.rsqrt(var.to(x.dtype) + 1e-8)


def kl_penalty(logp, ref_logp, kind: str):
    # k1: logp - ref ; abs: |logp - ref| ; k2 (mse): 0.5 (logp - ref)^2 ; k3 (low_var_kl):
    # exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]. A kind ending in "+" (k1+, k3+, ...) keeps its value
    # but takes k2's gradient (straight through: value - sg[value] of k2 added), as verl does for an unbiased KL
    # gradient
    if kind.endswith("+"):
        value = kl_penalty(logp, ref_logp, kind[:-1])
        k2 = 0.5 * (logp - ref_logp).square()
        return k2 - k2.detach() + value.detach()
    diff = logp - ref_logp
    if kind in ("kl", "k1"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    if kind in ("low_var_kl", "k3"):
        kl = (ref_logp - logp).clamp(-20, 20)
        return (kl.exp() - kl - 1).clamp(-10, 10)
    raise ValueError(f"unknown kl penalty {kind!r}")


@dataclass(frozen=True)
class GlobalBatch:
    """The mini batch a micro batch belongs to, over every data-parallel rank: what verl's engine workers normalise
    each micro batch's loss by (verl's global_batch_info: dp_size, batch_num_tokens, global_batch_size)."""

    dp_size: int  # data-parallel ranks (the ranks of one sequence-parallel group count once)
    tokens: float  # response tokens of the mini batch on all of them
    seqs: int  # its sequences on all of them (verl: ppo_mini_batch_size x rollout.n)


@dataclass(frozen=True)
class Agg:
    """A loss aggregation mode, and under verl's engine workers the global mini batch it normalises by."""

    mode: str
    batch: GlobalBatch | None = None


# verl 0.9's loss_agg_mode values (core_algos.agg_loss)
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def with_mode(agg: str | Agg, mode: str) -> str | Agg:
    """A loss with an aggregation of its own (SAPO) keeps the global batch, as verl's pass it on."""
    return Agg(mode, agg.batch) if isinstance(agg, Agg) else mode


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    # sum(x * m), a NaN where m = 0 left out (verl's masked_sum)
    valid = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return (valid * mask).sum() if dim is None else (valid * mask).sum(dim)


def agg_loss(loss, mask, agg: str | Agg):
    # verl 0.9's agg_loss. D: data-parallel ranks (1 without a global batch); N, S: the mini batch's tokens and
    # sequences over every rank (without a global batch: this micro batch's tokens, and its rows with a token).
    # token-mean: sum(l*m) / N * D ; token-sum: sum(l*m) * D ;
    # seq-mean-token-sum: sum_i(sum_t l*m) / S * D ; seq-mean-token-mean: sum_i(sum_t l*m / (sum_t m + 1e-8)) / S * D ;
    # seq-mean-token-sum-norm: seq-mean-token-sum / T (T = response length, a constant normaliser as in Dr.GRPO).
    # Rows without a token count in neither sum. D undoes the gradient all-reduce's average over the ranks.
    mode, g = (agg, None) if isinstance(agg, str) else (agg.mode, agg.batch)
    dp = 1 if g is None else g.dp_size
    if mode == "token-sum":
        return masked_sum(loss, mask) * dp
    if mode == "token-mean":
        tokens = mask.sum().clamp_min(1e-8) if g is None else max(g.tokens, 1e-8)
        return masked_sum(loss, mask) / tokens * dp
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}")
    per_row = masked_sum(loss, mask, -1)
    if mode == "seq-mean-token-mean":
        per_row = per_row / (mask.sum(-1) + 1e-8)
    rows = (mask.sum(-1) > 0).to(loss.dtype)
    seqs = rows.sum().clamp_min(1e-8) if g is None else g.seqs
    out = masked_sum(per_row, rows) / seqs * dp
    return out / loss.shape[-1] if mode == "seq-mean-token-sum-norm" else out


def global_agg_loss(loss, mask, mode: str, g: GlobalBatch):
    """One micro batch's share of the whole mini batch's loss (verl's engine workers), backpropagated as it is: the
    shares of a mini batch's micro batches add up to its loss however its rows are cut."""
    return agg_loss(loss, mask, Agg(mode, g))


def value_loss(values, old_values, returns, mask, clip: float, agg: str | Agg = "token-mean"):
    """(0.5 x the aggregated clipped squared error, the share of tokens where the clipped error is the larger);
    verl 0.9's compute_value_loss, with the global batch under its engine workers (agg an Agg)."""
    # V_clip = min(max(V, old - c), old + c); L = 0.5 max((V - R)^2, (V_clip - R)^2)
    v_clipped = torch.maximum(torch.minimum(values, old_values + clip), old_values - clip)
    l1 = (values - returns).square()
    l2 = (v_clipped - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(l1, l2), mask, agg)
    return loss, masked_mean((l2 > l1).float(), mask)


def entropy_from_logprobs(logp):
    # H = -sum exp(log p) log p, from a log_softmax already at hand
    return -(logp.exp() * logp).sum(-1)


class FixedKLController:
    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    # e = clip(kl / target - 1, +-0.2); beta <- beta * (1 + e * n_steps / horizon)   (Ziegler et al. 2019)
    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = max(-0.2, min(0.2, current_kl / self.target - 1))
        self.value *= 1 + error * n_steps / self.horizon


def kl_controller(cfg):
    if cfg.type == "adaptive":
        return AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.horizon)
    return FixedKLController(cfg.kl_coef)


def apply_kl_in_reward(token_scores, logp, ref_logp, mask, beta: float, kind: str):
    # r_t = score_t - beta * KL_t ; returns rewards and the batch mean KL (sequence mean, then batch mean)
    kl = kl_penalty(logp, ref_logp, kind) * mask
    seq_kl = (kl.sum(-1) / mask.sum(-1).clamp_min(1)).mean()
    return token_scores - beta * kl, float(seq_kl)


def explained_variance(values, returns, mask) -> float:
    # 1 - Var(R - V) / Var(R)
    var_r = masked_mean((returns - masked_mean(returns, mask)).square(), mask)
    diff = returns - values
    var_d = masked_mean((diff - masked_mean(diff, mask)).square(), mask)
    return float(1 - var_d / (var_r + 1e-8)) if not math.isclose(float(var_r), 0.0) else 0.0
