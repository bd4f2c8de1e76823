"""The RL math as pure tensor functions. Shapes: [batch, response_len]; mask is 1 on response tokens.

Semantics follow verl's core_algos so results compare side by side.
"""

from __future__ import annotations

import math

import torch

EPS = 1e-6


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    # sum(x * m) / sum(m)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1e-8) if dim is not None else (x * mask).sum() / mask.sum().clamp_min(1e-8)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # (x - mean) / sqrt(var + 1e-8), statistics over masked entries (unbiased variance, as verl)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    n = mask.sum()
    var = var * n / (n - 1).clamp_min(1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def gae_advantages(rewards, values, mask, gamma: float, lam: float):
    # delta_t = r_t + gamma * V_{t+1} - V_t ;  A_t = delta_t + gamma * lam * A_{t+1} ;  returns = A + V
    T = rewards.shape[1]
    next_value = torch.zeros_like(rewards[:, 0])
    last = torch.zeros_like(rewards[:, 0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = delta + gamma * lam * last
        # padding after EOS keeps the later values out of the recursion
        last = last * mask[:, t]
        next_value = values[:, t] * mask[:, t]
        adv[:, t] = last
    returns = adv + values
    return masked_whiten(adv, mask) * mask, returns


def _group_ids(index) -> list:
    return list(index.tolist() if hasattr(index, "tolist") else index)


def grpo_advantages(scores, mask, index, norm_by_std: bool = True):
    # A_i = (s_i - mean(s_group)) / (std(s_group) + eps); Dr.GRPO (norm_by_std=False): A_i = s_i - mean(s_group)
    ids = _group_ids(index)
    adv = torch.zeros_like(scores)
    for g in set(ids):
        sel = torch.tensor([i == g for i in ids], device=scores.device)
        s = scores[sel]
        if s.numel() == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = s.mean(), s.std()
        adv[sel] = (s - mean) / (std + EPS) if norm_by_std else s - mean
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


def rloo_advantages(scores, mask, index):
    # A_i = s_i * n/(n-1) - mean(s_group) * n/(n-1)  ==  s_i - mean of the other n-1 samples
    ids = _group_ids(index)
    adv = torch.zeros_like(scores)
    for g in set(ids):
        sel = torch.tensor([i == g for i in ids], device=scores.device)
        s = scores[sel]
        n = s.numel()
        adv[sel] = s * n / (n - 1) - s.mean() * n / (n - 1) if n > 1 else s
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


def reinforce_pp_advantages(token_rewards, mask, gamma: float):
    # G_t = r_t + gamma * G_{t+1} ; A = whiten(G) over the batch
    T = token_rewards.shape[1]
    ret = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(T)):
        running = token_rewards[:, t] + gamma * running
        ret[:, t] = running
        running = running * mask[:, t]
    return masked_whiten(ret, mask) * mask, ret


def kl_penalty(logp, ref_logp, kind: str):
    # k1: logp - ref ; abs: |logp - ref| ; k2 (mse): 0.5 (logp - ref)^2 ; k3 (low_var_kl): exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10]
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


def agg_loss(loss, mask, mode: str):
    # token-mean: sum(l*m)/sum(m); seq-mean-token-sum: mean_b sum_t l*m; seq-mean-token-mean: mean_b (sum_t l*m / sum_t m);
    # seq-mean-token-sum-norm: sum(l*m) / T (T = response length, a constant normaliser as in Dr.GRPO)
    if mode == "token-mean":
        return masked_mean(loss, mask)
    if mode == "seq-mean-token-sum":
        return (loss * mask).sum(-1).mean()
    if mode == "seq-mean-token-mean":
        return ((loss * mask).sum(-1) / mask.sum(-1).clamp_min(1)).mean()
    if mode == "seq-mean-token-sum-norm":
        return (loss * mask).sum() / loss.shape[-1] / loss.shape[0]
    raise ValueError(f"unknown loss_agg_mode {mode!r}")


def policy_loss(old_logp, logp, adv, mask, clip_low=0.2, clip_high=0.2, clip_c=3.0, agg="token-mean"):
    # r = exp(clamp(logp - old, +-20)); L = max(-A r, -A clip(r, 1-lo, 1+hi)); for A<0 also min(L, -A c) (dual clip)
    ratio = torch.exp((logp - old_logp).clamp(-20.0, 20.0))
    ppo_kl = masked_mean(old_logp - logp, mask)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    clipped = torch.maximum(l1, l2)
    clipfrac = masked_mean((l2 > l1).float(), mask)
    l3 = -adv * clip_c
    dual = torch.minimum(l3, clipped)
    loss = torch.where(adv < 0, dual, clipped)
    return agg_loss(loss, mask, agg), clipfrac, ppo_kl


def value_loss(values, old_values, returns, mask, clip: float, agg="token-mean"):
    # V_clip = old + clip(V - old, +-c); L = 0.5 max((V - R)^2, (V_clip - R)^2)
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
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
