"""Advantage estimators by name (`algorithm.adv_estimator`), as verl's `register_adv_est`.

Each estimator is a pure tensor function in a module of its own that registers itself here with what
it needs; config validation and the worker read those declarations instead of testing names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..core_algos import AllReduce


@dataclass
class AdvantageInput:
    token_rewards: torch.Tensor  # [B, R]: the outcome score on the last response token, minus any KL in the reward
    mask: torch.Tensor  # [B, R]
    index: list  # [B]: the prompt each sample answers (samples of one prompt share it)
    values: torch.Tensor | None  # [B, R]: the critic's values, for estimators that declare needs_critic
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    allreduce: AllReduce  # sums over every worker's shard: batch statistics over the whole batch
    baselines: torch.Tensor | None = None  # [B]: the greedy response's reward of each sample's prompt, where declared


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable[[AdvantageInput], tuple[torch.Tensor, torch.Tensor]]  # -> (advantages, returns), both [B, R]
    needs_critic: bool = False  # a value model is built and trained
    needs_groups: bool = False  # compares the n samples of one prompt: rollout.n >= 2
    needs_greedy_baseline: bool = (
        False  # each prompt's greedy response is generated and scored (AdvantageInput.baselines)
    )


ESTIMATORS: dict[str, Estimator] = {}


def register(name: str, *, needs_critic: bool = False, needs_groups: bool = False, needs_greedy_baseline: bool = False):
    def deco(fn):
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ESTIMATORS[name] = Estimator(name, fn, needs_critic, needs_groups, needs_greedy_baseline)
        return fn

    return deco
