"""Reward managers of your own (verl 0.9's RewardManagerBase subclasses): found, built and called as verl's reward
loop finds, builds and calls them (verl/trainer/ppo/reward.py, verl/experimental/reward_loop/reward_loop.py).

Which class: reward_model.reward_manager (verl 0.9's reward.reward_manager.name) with reward_model.reward_loop_source
(reward.reward_manager.source): `register`, a name given with @register (rlrig's reward/verl_api.py, or verl's own
where the class's module imported it) by the file custom_reward_function.path or reward_loop_module_path loads;
`importlib`, the class of that name in the file reward_loop_module_path (reward.reward_manager.module.path) names.
naive and dapo under `register` stay rlrig's own (reward/managers.py), as verl's built-ins of those names score.

Built once per worker with verl's arguments: the run's config in verl 0.9's layout (an OmegaConf DictConfig), the
policy's tokenizer, compute_score (the custom reward function, or the default with verl's keyword names),
reward_router_address=None and reward_model_tokenizer=None (no reward model runs beside it). Each sample is scored
by its own `run_single` on a DataProto of length 1 (reward/verl_api.py's docstring lists its fields), the batch's
calls gathered on one event loop, as verl's reward-loop worker gathers its chunk. A sample an agent loop of your own
already scored is not handed to it, as in verl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib.util
import inspect
import sys
import threading

import numpy as np
import torch

from ..errors import ConfigError, first_line
from . import verl_api
from .managers import MANAGERS, is_own

VERL_BASE = "verl.experimental.reward_loop.reward_manager.base"
VERL_REGISTRY = "verl.experimental.reward_loop.reward_manager.registry"
SHAPE = "{'reward_score': float, 'reward_extra_info': dict}"


class OwnRewardError(ConfigError):
    """A reward manager of your own raised, or returned what is not a score: one line naming the class and the fix
    (the run stops in the step, as verl's reward loop fails with its manager's exception)."""


@functools.cache
def _namespace(path: str, keys: str) -> dict:
    """The globals of the file (or pkg:// module) `path`, run once per process: run again, its classes would be
    new ones, which verl's @register refuses under a name it holds."""
    from ..data.extern import load_object

    return load_object(path, "__dict__", keys)


def _registered(name: str) -> type | None:
    """The class registered under `name`: rlrig's registry, then verl's where verl's registry is loaded (a class
    of your own imported it) or importable (its gdpo, rate_limited, remote)."""
    if name in verl_api.REWARD_MANAGER:
        return verl_api.REWARD_MANAGER[name]
    if VERL_REGISTRY not in sys.modules and importlib.util.find_spec("verl") is not None:
        try:
            importlib.import_module("verl.experimental.reward_loop.reward_manager")
        except Exception:  # a verl without the reward loop, or one that fails to import: rlrig's names only
            return None
    registry = getattr(sys.modules.get(VERL_REGISTRY), "REWARD_MANAGER", {})
    return registry.get(name)


def resolve(cfg) -> type:
    """The class of the run's reward manager of your own (is_own), checked to be one; ConfigError naming the fix."""
    rm, custom = cfg.reward_model, cfg.custom_reward_function
    source, name, path = rm.reward_loop_source, rm.reward_manager, rm.reward_loop_module_path
    if source == "importlib":
        if not path:
            raise ConfigError(
                "reward.reward_manager.source=importlib needs reward.reward_manager.module.path, the file (or "
                "pkg://module) with your reward manager class, named by reward.reward_manager.name"
            )
        if name in MANAGERS:
            raise ConfigError(
                f"reward.reward_manager.source=importlib loads the class named by reward.reward_manager.name "
                f"(reward_model.reward_manager), which is {name}; set it to your class's name (verl 0.9 reads "
                "neither reward_model.reward_loop_class_name nor reward.reward_manager.module.name)"
            )
        cls = _namespace(path, "reward.reward_manager.module.path").get(name)
        if cls is None:
            raise ConfigError(f"reward.reward_manager.module.path/name: {path} has no {name}")
    elif source == "register":
        cls = _registered(name)
        for file, keys in ((custom.path, "custom_reward_function.path"), (path, "reward.reward_manager.module.path")):
            if cls is None and file:
                _namespace(file, keys)
                cls = _registered(name)
        if cls is None:
            known = sorted({*MANAGERS, *verl_api.REWARD_MANAGER})
            raise ConfigError(
                f"reward.reward_manager.name={name}: no reward manager is registered under that name (the names are "
                f"{', '.join(known)}); register your class with @register({name!r}) in the file "
                "custom_reward_function.path or reward.reward_manager.module.path loads, or load it by class name "
                "with reward.reward_manager.source=importlib and module.path"
            )
    else:
        raise ConfigError(f"reward.reward_manager.source={source}: verl's sources are register and importlib")
    check_class(cls, name)
    return cls


def check_class(cls, name: str) -> None:
    """A RewardManagerBase (rlrig's or verl's) with `async def run_single`; verl's older AbstractRewardManager
    (`__call__(data, return_dict)`), which verl 0.9's reward loop no longer loads, is refused with the port."""
    bases = [verl_api.RewardManagerBase]
    if VERL_BASE in sys.modules:
        bases.append(sys.modules[VERL_BASE].RewardManagerBase)
    what = getattr(cls, "__qualname__", repr(cls))
    if not isinstance(cls, type) or not issubclass(cls, tuple(bases)):
        legacy = isinstance(cls, type) and any("__call__" in vars(k) for k in cls.__mro__[:-1])
        hint = (
            "; it looks like verl's older AbstractRewardManager (__call__(data, return_dict)), which verl 0.9's "
            "reward loop no longer loads: port it to run_single"
            if legacy
            else ""
        )
        raise ConfigError(
            f"reward manager {name}: {what} is not a RewardManagerBase; subclass "
            f"rlrig.trainer.reward.verl_api.RewardManagerBase (or verl's) and define async run_single(data){hint}"
        )
    if not inspect.iscoroutinefunction(getattr(cls, "run_single", None)):
        raise ConfigError(f"reward manager {name}: {what}.run_single must be `async def run_single(self, data)`")
    if inspect.isabstract(cls):
        raise ConfigError(f"reward manager {name}: {what} leaves abstract methods undefined; define run_single")
    if any("assemble_rm_scores" in vars(k) for k in cls.__mro__ if k not in bases and k is not object):
        # verl places the scores in the batch through it; rlrig's step places each on the response's last token
        raise ConfigError(
            f"reward manager {name}: {what} overrides assemble_rm_scores, which rlrig does not call (each score goes "
            "on the response's last token, as verl's own assemble_rm_scores puts it); remove the override"
        )


def verl_config(cfg):
    """The run's config as verl 0.9 hands it to a reward manager: rlrig's sections under verl's names, the reward
    keys in verl 0.9's `reward` section (its legacy reward_model, custom_reward_function and sandbox_fusion moved
    there, as verl's migrate_legacy_reward_impl moves them)."""
    from omegaconf import OmegaConf

    d = dataclasses.asdict(cfg)
    rm, custom = d.pop("reward_model"), d.pop("custom_reward_function")
    rollout = d["actor_rollout_ref"]["rollout"]
    rollout.update(prompt_length=cfg.data.max_prompt_length, response_length=cfg.data.max_response_length)
    d["reward"] = {
        "num_workers": rm.get("num_workers", 8),
        "custom_reward_function": custom,
        "reward_manager": {
            "source": rm["reward_loop_source"],
            "name": rm["reward_manager"],
            "module": {"path": rm["reward_loop_module_path"], "name": "custom_reward_manager"},
        },
        "reward_model": {
            "enable": rm["enable"],
            "enable_resource_pool": rm["enable_resource_pool"],
            "n_gpus_per_node": rm["n_gpus_per_node"],
            "nnodes": rm["nnodes"],
            "model_path": rm["model"]["path"] or None,
            "rollout": rm["rollout"],
        },
        "reward_kwargs": rm["reward_kwargs"],
        "sandbox_fusion": rm["sandbox_fusion"],
    }
    return OmegaConf.create(d)


def verl_compute_score(fn):
    """rlrig's default reward function under verl's keyword names (data_source, solution_str, ground_truth,
    extra_info), as verl's default_compute_score is called; a custom function is handed over as it is."""

    def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return fn(data_source, solution_str, ground_truth, extra_info, **kwargs)

    return default_compute_score


def _one(value) -> np.ndarray:
    out = np.empty(1, dtype=object)
    out[0] = value
    return out


def sample_data(row: dict, prompt_key: str, prompt: list[int], response: list[int], turn: dict | None, make):
    """One sample as verl's agent loop hands it to the reward loop: its prompt and response tokens unpadded, the
    row's fields (its messages, row[prompt_key], as raw_prompt), its turns and its loop's extra fields.
    `make(tensors, non_tensors)`: the DataProto class's."""
    prompts, responses = torch.tensor([prompt], dtype=torch.int64), torch.tensor([response], dtype=torch.int64)
    input_ids = torch.cat([prompts, responses], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "position_ids": torch.arange(input_ids.shape[1]).unsqueeze(0),
    }
    turn = dict(turn or {})
    num_turns = turn.pop("num_turns", 2)  # a single-turn sample: the user's turn and the model's
    extra = dict(row.get("extra_info") or {})  # a copy: verl's managers update it in place
    fields = {k: v for k, v in row.items() if k not in ("input_ids", prompt_key, "extra_info")}
    fields.update(
        raw_prompt=list(row.get(prompt_key) or []),
        extra_info=extra,
        index=extra.get("index", 0),
        tools_kwargs=extra.get("tools_kwargs") or {},
        interaction_kwargs=extra.get("interaction_kwargs") or {},
    )
    non_tensors = {k: _one(v) for k, v in fields.items()}
    non_tensors.update(
        __num_turns__=np.array([num_turns]),
        tool_extra_fields=_one(turn),
        prompt_len=np.array([len(prompt)]),
        response_len=np.array([len(response)]),
    )
    return make(tensors, non_tensors)


def _verl_data_proto():
    """verl's DataProto.from_dict where verl is importable, else rlrig's (verl_api.DataProto)."""
    if importlib.util.find_spec("verl") is not None:
        try:
            from verl import DataProto

            return DataProto.from_dict
        except Exception:  # a verl that fails to import: rlrig's container, with the same fields
            pass
    return verl_api.DataProto.from_dict


def describe(klass: type, name: str) -> str:
    return f"reward manager {name} ({klass.__module__}.{klass.__qualname__})"


def verl_kwargs(klass: type, config, tokenizer, compute_score, judge: dict) -> dict:
    """verl's constructor arguments; reward_router_address and reward_model_tokenizer (the generative judge's,
    `judge`; None where none runs beside it) only where the constructor takes them, so a class that keeps
    RewardManagerBase's __init__ builds."""
    kwargs = {"config": config, "tokenizer": tokenizer, "compute_score": compute_score}
    params = inspect.signature(klass.__init__).parameters
    for key in ("reward_router_address", "reward_model_tokenizer"):
        if key in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            kwargs[key] = judge.get(key)
    return kwargs


class OwnManager:
    """The worker's reward manager of your own, built once with verl's arguments on an event loop of its own, on
    which every batch's run_single calls run."""

    def __init__(self, cls: type, name: str, manager, loop: asyncio.AbstractEventLoop, make, prompt_key: str):
        self.cls, self.name, self.manager, self.loop = cls, name, manager, loop
        self.make, self.prompt_key = make, prompt_key
        self.lock = threading.Lock()

    @property
    def what(self) -> str:
        return describe(self.cls, self.name)

    @classmethod
    def of(cls, cfg, tokenizer, fn, judge: dict) -> OwnManager | None:
        """The run's reward manager of your own, built; None where the run uses rlrig's naive or dapo. `fn`: the
        reward function already loaded (rules.reward_fn), its compute_score; `judge`: the generative judge's
        reward_router_address and reward_model_tokenizer ({}: none)."""
        if not is_own(cfg.reward_model):
            return None
        klass = resolve(cfg)
        name = cfg.reward_model.reward_manager
        loop = asyncio.new_event_loop()
        compute_score = fn if cfg.custom_reward_function.path else verl_compute_score(fn)
        config = verl_config(cfg)

        kwargs = verl_kwargs(klass, config, tokenizer, compute_score, judge)

        async def build():  # on its loop, so that the manager's self.loop is the one its calls run on
            return klass(**kwargs)

        try:
            manager = loop.run_until_complete(build())
        except Exception as e:
            loop.close()
            raise OwnRewardError(
                f"{describe(klass, name)} raised {type(e).__name__} when built with verl's arguments "
                f"({', '.join(kwargs)}): {first_line(e)}"
            ) from None
        return cls(klass, name, manager, loop, _verl_data_proto(), cfg.data.prompt_key)

    def scores(self, samples: list[tuple[dict, list[int], list[int], dict | None]]) -> list[tuple[float, dict]]:
        """Each sample (its row, prompt tokens, response tokens, agent-loop fields) scored by run_single: its score
        and its reward_extra_info."""
        data = [sample_data(row, self.prompt_key, p, r, turn, self.make) for row, p, r, turn in samples]

        async def run_all():
            return await asyncio.gather(*(self.manager.run_single(d) for d in data), return_exceptions=True)

        with self.lock:  # one batch at a time on the manager's loop, whichever thread asks
            results = self.loop.run_until_complete(run_all()) if data else []
        return [self.checked(out) for out in results]

    def checked(self, out) -> tuple[float, dict]:
        if isinstance(out, BaseException):
            frames = inspect.getinnerframes(out.__traceback__) if out.__traceback__ else []
            where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
            raise OwnRewardError(
                f"{self.what}: run_single raised {type(out).__name__}: {first_line(out)}{where}"
            ) from None
        if not isinstance(out, dict) or "reward_score" not in out:
            got = f"a dict without reward_score (keys {sorted(out)})" if isinstance(out, dict) else type(out).__name__
            raise OwnRewardError(f"{self.what}: run_single returned {got}; return {SHAPE}")
        score, extra = out["reward_score"], out.get("reward_extra_info") or {}
        try:
            score = float(score)
        except (TypeError, ValueError):
            raise OwnRewardError(
                f"{self.what}: run_single returned reward_score={score!r}, not a number; return {SHAPE}"
            ) from None
        if not isinstance(extra, dict):
            raise OwnRewardError(
                f"{self.what}: run_single returned reward_extra_info of type {type(extra).__name__}; return {SHAPE}"
            )
        return score, dict(extra)
