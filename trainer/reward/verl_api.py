"""verl 0.9's reward-manager API (verl/experimental/reward_loop/reward_manager) for reward classes of your own,
without verl.

A class written for verl runs under rlrig by changing its import lines to this module: it subclasses
RewardManagerBase, is constructed as `cls(config=..., tokenizer=..., compute_score=..., reward_router_address=None,
reward_model_tokenizer=None)`, and `await run_single(data)` scores one sample, handed to it as a DataProto of length 1
with verl's fields, and returns {"reward_score": float, "reward_extra_info": {name: value}}. It is named by
reward.reward_manager.source=register with @register's name, or source=importlib with module.path (the file) and
name (the class). Where verl itself is importable, a class subclassing verl's own RewardManagerBase runs unchanged
(reward/own_managers.py gives it verl's DataProto).

What the sample's DataProto holds (verl's reward loop, per sample): batch: prompts (1, prompt tokens), responses
(1, response tokens: the model's and the turns a loop added), input_ids, attention_mask (ones), position_ids;
non_tensor_batch: the data row's fields (data_source, reward_model {ground_truth, ...}, extra_info, raw_prompt, index,
tools_kwargs, interaction_kwargs, agent_name, ...), __num_turns__, tool_extra_fields (the agent loop's extra fields),
prompt_len, response_len; each an array of length 1.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class DataProtoItem:
    """One sample of a DataProto (`data[0]`): its tensors without the batch dimension, its other fields."""

    batch: dict[str, torch.Tensor] | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """verl's batch container as reward managers read it: `batch` (tensors, first dimension the batch),
    `non_tensor_batch` (numpy object arrays of the same length), `meta_info`. `data[i]` is a DataProtoItem; a slice,
    a list or an array of indices is a DataProto."""

    batch: dict[str, torch.Tensor] | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, tensors: dict | None = None, non_tensors: dict | None = None, meta_info: dict | None = None):
        return cls(dict(tensors or {}) or None, dict(non_tensors or {}), dict(meta_info or {}))

    def __len__(self) -> int:
        if self.batch:
            return len(next(iter(self.batch.values())))
        return len(next(iter(self.non_tensor_batch.values()))) if self.non_tensor_batch else 0

    def __getitem__(self, item):
        if isinstance(item, int | np.integer):
            tensors = {k: v[item] for k, v in self.batch.items()} if self.batch else None
            return DataProtoItem(tensors, {k: v[item] for k, v in self.non_tensor_batch.items()}, self.meta_info)
        if isinstance(item, slice):
            index = list(range(len(self)))[item]
        elif isinstance(item, list | np.ndarray | torch.Tensor):
            index = [int(i) for i in item]
        else:
            raise TypeError(f"Indexing with {type(item)} is not supported")
        tensors = {k: v[index] for k, v in self.batch.items()} if self.batch else None
        return DataProto(tensors, {k: v[index] for k, v in self.non_tensor_batch.items()}, self.meta_info)


def get_event_loop() -> asyncio.AbstractEventLoop:
    """verl's: the thread's event loop, made and set where it has none."""
    try:
        return asyncio.get_event_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        return loop


RawRewardFn = Callable[..., Any] | None


class RewardManagerBase(ABC):
    """A reward manager of your own, as verl 0.9's: `config` is the run's whole config in verl 0.9's layout (an
    OmegaConf DictConfig: config.reward.reward_kwargs, config.trainer.experiment_name, ...), `tokenizer` the policy's,
    `compute_score` the custom reward function or the default, called with keywords data_source, solution_str,
    ground_truth, extra_info. self.loop is the event loop run_single runs on (for run_in_executor)."""

    _class_initialized = False

    def __init__(self, config, tokenizer, compute_score: RawRewardFn):
        self.config = config
        self.tokenizer = tokenizer
        self.compute_score = compute_score
        self.loop = get_event_loop()
        self.init_class(config, tokenizer)

    @classmethod
    def init_class(cls, config, tokenizer) -> None:
        """State shared by every instance of the class, set up once."""
        if cls._class_initialized:
            return
        cls._class_initialized = True

    @abstractmethod
    async def run_single(self, data: DataProto) -> dict:
        """One sample (a DataProto of length 1): {"reward_score": float, "reward_extra_info": dict}."""
        raise NotImplementedError


# name -> class: @register's names, as verl's REWARD_MANAGER
REWARD_MANAGER: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """A class decorator naming a reward manager, so reward.reward_manager.name=<name> (source=register) picks it."""

    def decorator(cls: type) -> type:
        old = REWARD_MANAGER.get(name)
        # the same class from its file run again (the file is loaded once for the reward function, once for this)
        same = old is not None and (old.__module__, old.__qualname__) == (cls.__module__, cls.__qualname__)
        if old is not None and old is not cls and not same:
            raise ValueError(f"reward manager {name} has already been registered: {REWARD_MANAGER[name]} vs {cls}")
        REWARD_MANAGER[name] = cls
        return cls

    return decorator


def get_reward_manager_cls(name: str) -> type:
    """The class registered under `name`."""
    if name not in REWARD_MANAGER:
        raise ValueError(f"Unknown reward manager: {name}")
    return REWARD_MANAGER[name]
