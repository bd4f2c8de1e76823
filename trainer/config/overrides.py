"""The one place that parses `KEY=VALUE` overrides onto the typed config, and reports unknown keys.

Overrides use verl's dotted keys; values are Hydra/OmegaConf literals (null, True, numbers, ['a','b']). The
FAQ's old `ray_init.*` spellings are accepted as aliases.
"""

from __future__ import annotations

from typing import Any, get_type_hints

from ..errors import ConfigError
from . import verl_keys
from .derived import derive
from .interpolation import Resolver
from .literals import parse_literal
from .schema import Config, all_keys, canonical_strategy
from .validation import validate


def _coerce(value: Any, hint: Any, key: str) -> Any:
    text = str(hint)
    if value is None:
        if "None" in text or "Optional" in text or hint is Any:
            return None
        raise ConfigError(f"{key}=null is not allowed; give a value")
    if hint is bool or text == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: expected True or False")
    if hint is int or text.startswith("int"):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (isinstance(value, float) and not value.is_integer())
        ):
            raise ConfigError(f"{key}={value!r}: expected a whole number")
        return int(value)
    if hint is float or text.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r}: expected a number")
        return float(value)
    if hint is list or text.startswith("list"):
        return value if isinstance(value, list) else [value]
    if isinstance(value, list) and "list[str]" in text:  # a file or a list of files: data.train_files, val_files
        return [str(v) for v in value]
    if hint is str or text.startswith("str"):
        return str(value)
    if hint is dict or text.startswith("dict"):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a mapping such as {{'key': 'value'}}")
        return value
    return value


def _dict_item(cfg: Config, key: str) -> tuple[dict, str] | None:
    """For `a.b.mapping.item`, where a.b.mapping is a dict field (Hydra's `+key.item=value`): (the dict, item)."""
    *parents, leaf = key.split(".")
    for cut in range(len(parents), 0, -1):
        obj = cfg
        for p in parents[:cut]:
            obj = getattr(obj, p, None)
            if obj is None:
                break
        if isinstance(obj, dict):
            for p in parents[cut:]:
                obj = obj.setdefault(p, {})
            return obj, leaf
    return None


def set_key(cfg: Config, key: str, raw: str) -> None:
    key = verl_keys.ALIASES.get(key, key)
    why = verl_keys.refusal(key, raw)
    if why:
        raise ConfigError(why)
    known = all_keys(cfg)
    if key not in known and (key in verl_keys.ACCEPTED_DEFAULTS or verl_keys.inert(key)):
        return  # verl's default of a feature rlrig does not have, or a setting of one that is off: nothing to do
    if key not in known and (item := _dict_item(cfg, key)):
        item[0][item[1]] = parse_literal(raw)
        return
    if key not in known:
        near = [s] if (s := verl_keys.suggest(key, known)) else []
        hint = f"; did you mean {near[0]}?" if near else "; run `rlrig train --print-config` to list the keys"
        raise ConfigError(f"unknown config key {key!r}{hint}")
    *parents, leaf = key.split(".")
    obj = cfg
    for p in parents:
        obj = getattr(obj, p)
    hint = get_type_hints(type(obj))[leaf]
    setattr(obj, leaf, _coerce(parse_literal(raw), hint, key))


def rollout_pool_defaults(cfg: Config, keys: set[str]) -> None:
    """What verl's one-step-off-policy recipe config sets, where the user did not: engines on a pool of their own stay
    awake (free_cache_engine=False: they hold their GPUs alone, and a sleeping engine could not take weights), and
    with samples generated a step before the weights they train, the PPO ratio is taken against the engine's own
    log-probs (bypass_mode=True) unless a rollout_correction key was given."""
    if cfg.actor_rollout_ref.hybrid_engine:
        pool_keys = sorted(k for k in keys if k.startswith("rollout."))
        if pool_keys:
            raise ConfigError(
                f"{pool_keys[0]} sizes the rollout pool of actor_rollout_ref.hybrid_engine=False (verl's one-step-off-"
                "policy recipe sets both); set actor_rollout_ref.hybrid_engine=False, or drop the rollout.* keys"
            )
        return
    if "actor_rollout_ref.rollout.free_cache_engine" not in keys:
        cfg.actor_rollout_ref.rollout.free_cache_engine = False
    if cfg.trainer.async_mode != "sync" and not any(k.startswith("algorithm.rollout_correction.") for k in keys):
        cfg.algorithm.rollout_correction.bypass_mode = True


def parse_overrides(overrides: list[str]) -> Config:
    """Overrides applied in order onto verl's defaults (a preset's, if any, come first: see config/presets.py; a
    config file's next: config/config_files.py), `${...}` in values resolved against the final values."""
    cfg = Config()
    resolve = Resolver(overrides)
    keys = set()
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
        key, raw = item.split("=", 1)
        # `+key=value` adds a key in Hydra; every key we accept already exists, so it just sets it.
        key = key.lstrip("+").strip()
        keys.add(key)
        try:
            set_key(cfg, key, resolve(key, raw))
        except ConfigError as e:
            where = getattr(item, "where", None)  # a key from a config file (config/config_files.py) names its line
            if where:
                raise ConfigError(f"{where}: {e}") from None
            raise
    a = cfg.actor_rollout_ref.actor
    a.strategy = canonical_strategy(a.strategy)
    rollout_pool_defaults(cfg, keys)
    derive(cfg)
    validate(cfg)
    return cfg
