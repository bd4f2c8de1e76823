"""ReMax: each sample against the reward of its prompt's greedy response (verl's `remax`); the worker
generates and scores that greedy response for every prompt before the advantages (timing_s/gen_max)."""

from __future__ import annotations

from .registry import AdvantageInput, register


def remax_advantages(token_rewards, mask, baselines):
    """(advantages, returns), both [B, R]; baselines [B]: the greedy response's reward of each sample's prompt."""
    # G_t = sum_{t' >= t} r_t' (the reward-to-go, no discount) ; A_t = G_t - b, b = the greedy response's reward
    returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    return returns - baselines.unsqueeze(-1) * mask, returns


@register("remax", needs_greedy_baseline=True)
def compute(x: AdvantageInput):
    """`remax`: the greedy responses' rewards as the baselines."""
    return remax_advantages(x.token_rewards, x.mask, x.baselines)
