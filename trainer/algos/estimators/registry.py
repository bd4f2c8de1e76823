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
    """What an estimator reads, for one worker's share of the step's samples (B rows, R response tokens). The
    optional fields are set where the estimator declares it needs them (Estimator's needs_*)."""

    token_rewards: torch.Tensor  # [B, R]: the outcome score on the last response token, minus any KL in the reward
    mask: torch.Tensor  # [B, R]
    index: list  # [B]: the prompt each sample answers (samples of one prompt share it)
    values: torch.Tensor | None  # [B, R]: the critic's values, for estimators that declare needs_critic
    gamma: float
    lam: float
    norm_adv_by_std_in_grpo: bool
    allreduce: AllReduce  # sums over every worker's shard: batch statistics over the whole batch
    baselines: torch.Tensor | None = None  # [B]: the greedy response's reward of each sample's prompt, where declared
    old_logp: torch.Tensor | None = None  # [B, R]: the actor's log-probs before the update
    sum_pi_squared: torch.Tensor | None = None  # [B, R]: sum_v pi(v)^2 at each response token, where declared
    is_weights: torch.Tensor | None = None  # [B, R]: rollout correction's importance weights (rollout_is)
    # [B, K]: each sample's reward components (algorithm.gdpo_reward_keys, in order), where declared
    components: torch.Tensor | None = None
    component_weights: list[float] | None = None  # [K]: algorithm.gdpo_reward_weights (None: all 1)


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: its function and what it needs, which config validation and the worker read."""

    name: str
    fn: Callable[[AdvantageInput], tuple[torch.Tensor, torch.Tensor]]  # -> (advantages, returns), both [B, R]
    needs_critic: bool = False  # a value model is built and trained
    # fails with fewer than 2 samples of a prompt (verl raises): rollout.n >= 2. The other group estimators take
    # a group of one as verl does (baseline 0), so verl's n=1 commands run unchanged
    needs_groups: bool = False
    needs_greedy_baseline: bool = (
        False  # each prompt's greedy response is generated and scored (AdvantageInput.baselines)
    )
    # the old-log-prob pass also yields sum_pi_squared (actor.calculate_sum_pi_squared=True, as verl asserts)
    needs_sum_pi_squared: bool = False
    # each sample's reward components: the reward function's fields algorithm.gdpo_reward_keys names
    needs_reward_components: bool = False


ESTIMATORS: dict[str, Estimator] = {}


def register(
    name: str,
    *,
    needs_critic: bool = False,
    needs_groups: bool = False,
    needs_greedy_baseline: bool = False,
    needs_sum_pi_squared: bool = False,
    needs_reward_components: bool = False,
):
    """Registers `fn(x: AdvantageInput) -> (advantages, returns)`, both [B, R] and 0 outside the mask, as
    algorithm.adv_estimator=`name`. The needs_* flags declare what it reads (Estimator's fields say what each
    builds); batch-wide statistics go through x.allreduce, so that every worker's shard sees the whole batch's.
    A name registered twice is a ValueError."""

    def deco(fn):
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ESTIMATORS[name] = Estimator(
            name, fn, needs_critic, needs_groups, needs_greedy_baseline, needs_sum_pi_squared, needs_reward_components
        )
        return fn

    return deco
