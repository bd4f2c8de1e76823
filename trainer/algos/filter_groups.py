"""DAPO's dynamic sampling (algorithm.filter_groups; verl's DAPO recipe, Yu et al., "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale"): a prompt whose samples all get the same value of the filter's metric
gives every sample the same advantage under a group estimator (GRPO's is 0), so it teaches nothing and is dropped.
Here are the metric's value of each sample and the rule that keeps a group; the driver draws more prompts until
the step's batch is full (driver/dynamic_sampling.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# metrics read from the sample's score rather than from the reward function's fields:
# reward: verl 0.9's canonical pre-KL reward (its default); seq_reward: the sum of the token-level scores (verl's
# token_level_scores); seq_final_reward: the sum of the token-level rewards, which are the scores unless KL is in
# the reward (start-up refuses that pair: rlrig applies the KL penalty after the filter)
FROM_SCORE = ("reward", "seq_reward", "seq_final_reward")


def sample_values(metric: str, scores: Sequence[float], fields: Sequence[dict]) -> list:
    """Each sample's value of `metric`: its score for FROM_SCORE, else the field of that name its reward function
    returned (verl's reward_extra_info: `acc` is the score of a function that returns a number; a dict's own keys,
    `score` among them); None where the sample has no such field."""
    if metric in FROM_SCORE:
        return [float(s) for s in scores]
    return [f.get(metric) for f in fields]


def kept_groups(values: Sequence, n: int) -> list[bool]:
    """Whether each group of n consecutive samples is kept: where its values differ (their standard deviation is not
    0, as verl computes it with np.std), or it has one sample."""
    out = []
    for g in range(0, len(values), n):
        group = values[g : g + n]
        out.append(len(group) == 1 or float(np.std(np.asarray(group, dtype=float))) > 0)
    return out
