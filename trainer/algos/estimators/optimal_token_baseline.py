"""Optimal token baseline (OTB, verl's optimal_token_baseline): a baseline for each response position, the prompt's
rewards-to-go weighted by how much score-function variance each sample's path has gathered up to that position.
tir_optimal_token_baseline is the same on each response's own tokens packed to the left (tool-integrated
reasoning: responses whose mask has holes), where responses of different lengths line up token by token.

    w_t = ||s_t||^2 ~ 1 - 2 pi(y_t) + sum_v pi(v)^2      (times rho_t^2, the rollout IS weight squared, when rollout_is)
    W_t = sum_{j<=t} w_j m_j                             (the path-variance proxy so far)
    G_t = sum_{j>=t} r_j m_j                             (reward-to-go)
    B_t = sum_i G_t^i W_t^i m_t^i / (sum_i W_t^i m_t^i + eps)   over the samples i of one prompt (0 for a group of one)
    A_t = (G_t - B_t) m_t

zero_tail: where one sample of a group is longer than all others, its baseline past the second-longest length is
0 (there, B_t would be its own G_t: a zero advantage). verl reads no key for it: on for OTB and TIR alike.
"""

from __future__ import annotations

import torch

from .groups import group_ids, prompt_groups
from .registry import AdvantageInput, register

EPS = 1e-8


def path_variance(old_logp, sum_pi_squared, mask, is_weights=None):
    """W_t [B, R]: the cumulative score-norm proxy."""
    w = 1 - 2 * old_logp.exp() + sum_pi_squared
    if is_weights is not None:
        w = w * is_weights**2
    return (w * mask).cumsum(-1)


def group_baselines(returns, path_w, mask, ids: list, zero_tail: bool) -> torch.Tensor:
    """B_t [B, R] of each sample's prompt group; rows whose id is None belong to no group (baseline 0)."""
    baselines = torch.zeros_like(returns)
    for g, rows in prompt_groups(ids, returns.device):
        if g is None or len(rows) < 2:
            continue
        w = path_w[rows] * mask[rows]
        baselines[rows] = ((returns[rows] * w).sum(0) / (w.sum(0) + EPS)).to(baselines.dtype)
        if zero_tail:
            lengths = mask[rows].sum(-1)
            second, top = torch.sort(lengths).values[-2:].tolist()
            if top > second and int((lengths == top).sum()) == 1:
                baselines[rows[lengths.argmax()], int(second) :] = 0.0
    return baselines


def otb_advantages(rewards, mask, index, old_logp, sum_pi_squared, is_weights=None, zero_tail=True):
    """(advantages, returns), both [B, R]."""
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    path_w = path_variance(old_logp, sum_pi_squared, mask, is_weights)
    baselines = group_baselines(returns, path_w, mask, group_ids(index), zero_tail)
    return (returns - baselines) * mask, returns


def tir_otb_advantages(rewards, mask, index, old_logp, sum_pi_squared, is_weights=None, zero_tail=True):
    """OTB on each response's tokens packed to the left (the k-th token of each sample against the k-th of the
    others), scattered back to their columns; samples without a token belong to no group."""
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    path_w = path_variance(old_logp, sum_pi_squared, mask, is_weights)
    kept = mask.bool()
    order = torch.argsort((~kept).to(torch.int8), dim=-1, stable=True)  # each row's tokens first, in order
    lengths = kept.sum(-1)
    packed_mask = (torch.arange(mask.shape[1], device=mask.device)[None] < lengths[:, None]).to(mask.dtype)
    packed_g, packed_w = returns.gather(-1, order) * packed_mask, path_w.gather(-1, order) * packed_mask
    ids = [g if n > 0 else None for g, n in zip(group_ids(index), lengths.tolist())]
    packed_adv = packed_g - group_baselines(packed_g, packed_w, packed_mask, ids, zero_tail)
    advantages = torch.zeros_like(returns).scatter(-1, order, packed_adv * packed_mask)
    return advantages * mask, returns


def _inputs(x: AdvantageInput) -> tuple:
    return x.token_rewards, x.mask, x.index, x.old_logp, x.sum_pi_squared, x.is_weights


@register("optimal_token_baseline", needs_sum_pi_squared=True)
def compute(x: AdvantageInput):
    """`optimal_token_baseline`: the old log-probs, sum_pi_squared and rollout_is weights the worker computed."""
    return otb_advantages(*_inputs(x))


@register("tir_optimal_token_baseline", needs_sum_pi_squared=True)
def compute_tir(x: AdvantageInput):
    """`tir_optimal_token_baseline`: as optimal_token_baseline, on each response's own tokens packed left."""
    return tir_otb_advantages(*_inputs(x))
