"""PF-PPO (algorithm.use_pf_ppo; verl's compute_pf_ppo_reweight_data, after Shao et al., "Policy Filtration in
RLHF"): once GAE has given advantages and returns, the whole batch is resampled with replacement, each sample
drawn with probability proportional to a weight of its score, so the update sees more of the samples whose
reward is most trustworthy. As in verl, only under adv_estimator=gae, and over the whole batch: the workers pool
their samples, draw the same indices from one seeded generator, and each keeps its share of the draw
(batch/exchange.py moves the samples; here are the weights and the draw).
"""

from __future__ import annotations

import torch


def weights(scores: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """verl's weights of each sample's score s (the sum of its token-level scores), floored at 1e-8:
    pow:        w = |s| ** weight_pow
    max_min:    w = 1 where s is the batch's highest or lowest score, else 0
    max_random: w = 0.4 where s is the batch's highest score, else 0.1"""
    if method == "pow":
        w = scores.abs().pow(weight_pow)
    elif method == "max_min":
        w = ((scores == scores.max()) | (scores == scores.min())).float()
    elif method == "max_random":
        w = torch.where(scores == scores.max(), 0.4, 0.1)
    else:
        raise ValueError(f"algorithm.pf_ppo.reweight_method={method}")
    return (w + 1e-8).clamp_min(1e-8)


def draw(scores: torch.Tensor, method: str, weight_pow: float, generator: torch.Generator) -> torch.Tensor:
    """As many indices as samples, with replacement, each i with probability w_i / sum(w)."""
    return torch.multinomial(
        weights(scores.float().cpu(), method, weight_pow), len(scores), replacement=True, generator=generator
    )
