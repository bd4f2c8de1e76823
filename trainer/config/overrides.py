"""The one place that parses `KEY=VALUE` overrides onto the typed config, and reports unknown keys.

Overrides use verl's dotted keys and are read by Hydra's own parser (config/literals.py), their `${...}` resolved
by OmegaConf (config/interpolation.py). The FAQ's old `ray_init.*` spellings are accepted as aliases.
"""

from __future__ import annotations

from typing import Any, get_type_hints

from ..errors import ConfigError
from . import verl09_keys, verl_keys
from .derived import derive
from .domains import value_at
from .interpolation import Resolver
from .literals import as_raw, parse_override
from .schema import Config, all_keys, canonical_strategy
from .validation import validate


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """A parsed value as the field's type, converted where OmegaConf converts it for verl's dataclass configs (the
    text '1e-3' to a float field, 'yes' to a bool one), refused in one line where it does not."""
    text = str(hint)
    if value is None:
        if "None" in text or "Optional" in text or hint is Any:
            return None
        raise ConfigError(f"{key}=null is not allowed; give a value")
    if value == "None" and "None" in text and any(t in text for t in ("int", "float", "bool")):
        raise ConfigError(f"{key}=None: Hydra reads None as the text 'None'; write {key}=null for no value")
    if hint is bool or text == "bool":
        return _as_bool(value, key)
    if hint is int or text.startswith("int"):
        return _as_int(value, key)
    if hint is float or text.startswith("float"):
        return _as_float(value, key)
    if hint is list or text.startswith("list"):
        return value if isinstance(value, list) else [value]
    if isinstance(value, list) and "list[str]" in text:  # a file or a list of files: data.train_files, val_files
        return [str(v) for v in value]
    if hint is str or text.startswith("str"):
        return str(value)
    if hint is dict or text.startswith("dict"):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a mapping such as {{key: value}}")
        return value
    return value


_TRUE, _FALSE = ("y", "yes", "on", "true"), ("n", "no", "off", "false")


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"{key}={value!r}: expected True or False")


def _as_int(value: Any, key: str) -> int:
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ConfigError(f"{key}={value!r}: expected a whole number") from None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise ConfigError(f"{key}={value!r}: expected a whole number")
    return int(value)


def _as_float(value: Any, key: str) -> float:
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise ConfigError(f"{key}={value!r}: expected a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}={value!r}: expected a number")
    return float(value)


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


def set_key(cfg: Config, key: str, value: Any) -> None:
    """`key` set to `value` (as Hydra parsed it), or refused in one line."""
    if verl_keys.not_given(key, value):
        return  # verl 0.9's "not given": OmegaConf's ???, or an old reward key at null
    given, key = key, verl_keys.aliased(key)
    why = verl_keys.refusal(key, as_raw(value))
    if why:
        raise ConfigError(why if given == key else f"{given}, which is {why}")
    known = all_keys(cfg)
    if key not in known and (key in verl_keys.ACCEPTED_DEFAULTS or key in verl_keys.NO_EFFECT):
        return  # verl's default of a feature rlrig does not have, or a key that changes nothing for rlrig
    if key not in known and (item := _dict_item(cfg, key)):
        item[0][item[1]] = value
        return
    if key not in known and _named_teacher_key(cfg, key, value):
        return
    if key not in known and (why := new_key_refusal(key)):
        raise ConfigError(f"{key}: {why}")
    if key not in known:
        near = [s] if (s := verl_keys.suggest(key, known)) else []
        hint = f"; did you mean {near[0]}?" if near else "; run `rlrig train --print-config` to list the keys"
        raise ConfigError(f"unknown config key {key!r}{hint}")
    *parents, leaf = key.split(".")
    obj = cfg
    for p in parents:
        obj = getattr(obj, p)
    hint = get_type_hints(type(obj))[leaf]
    setattr(obj, leaf, _coerce(value, hint, key))


_TEACHERS = "distillation.teacher_models."


def _named_teacher_key(cfg: Config, key: str, value: Any) -> bool:
    """`distillation.teacher_models.<name>.<rest>` (Hydra's `+` key of a teacher named beside teacher_model): set on
    that teacher, created at teacher_model's defaults, as `<rest>` of teacher_model is set, with its checks and
    refusals (named in the key given). False where the key is no such key."""
    from .schema import TeacherModelConfig

    name, _, rest = key[len(_TEACHERS) :].partition(".") if key.startswith(_TEACHERS) else ("", "", "")
    if not rest or name == "teacher_model" or not name.isidentifier():
        return False
    named = cfg.distillation.teacher_models.named
    teacher = named.get(name) or TeacherModelConfig()
    scratch = Config()
    scratch.distillation.teacher_models.teacher_model = teacher
    try:
        set_key(scratch, f"{_TEACHERS}teacher_model.{rest}", value)
    except ConfigError as e:
        raise ConfigError(str(e).replace(f"{_TEACHERS}teacher_model.", f"{_TEACHERS}{name}.")) from None
    named[name] = teacher
    return True


def new_key_refusal(key: str) -> str | None:
    """Why a key verl adds under a section (a second teacher) is refused, or None (then it is unknown)."""
    return next((why for p, why in verl09_keys.REFUSED_NEW_KEYS.items() if key.startswith(p)), None)


FULLY_ASYNC = "fully_async_policy"


def async_mode_of(cfg: Config, keys: set[str]) -> None:
    """verl picks its fully async recipe by entry point, whose config holds async_training; rlrig by
    trainer.async_mode, which any async_training key sets (so verl's command lines run unchanged)."""
    asked = sorted(k for k in keys if k.startswith("async_training."))
    if not asked:
        return
    if "trainer.async_mode" in keys and cfg.trainer.async_mode != FULLY_ASYNC:
        raise ConfigError(
            f"{asked[0]} is a key of verl's fully async recipe, which trainer.async_mode={cfg.trainer.async_mode} is "
            f"not; drop trainer.async_mode or set it to {FULLY_ASYNC}"
        )
    cfg.trainer.async_mode = FULLY_ASYNC


def fully_async_batches(cfg: Config) -> None:
    """verl's fully async rollouter asserts data.train_batch_size=0 and data.gen_batch_size=1 (its config's default):
    it draws one prompt at a time and the trainer takes async_training.require_batches x ppo_mini_batch_size prompts
    per update, which rlrig's trainer then takes as its batch. (trainer.total_training_steps, which verl's fully async
    trainer does not read, caps the weight versions in rlrig: its steps; driver/fully_async.py.)"""
    d, at, actor = cfg.data, cfg.async_training, cfg.actor_rollout_ref.actor
    if cfg.actor_rollout_ref.hybrid_engine:  # the first thing to fix
        raise ConfigError(
            "verl's fully async recipe (async_training.*) generates while the trainer trains, so the engines need a "
            "pool of their own: set actor_rollout_ref.hybrid_engine=False with rollout.nnodes and "
            "rollout.n_gpus_per_node"
        )
    if actor.use_rollout_log_probs not in (None, at.use_rollout_log_probs):
        raise ConfigError(
            f"actor_rollout_ref.actor.use_rollout_log_probs={actor.use_rollout_log_probs} with "
            f"async_training.use_rollout_log_probs={at.use_rollout_log_probs}: verl's fully async config sets the "
            "actor's from the other; set them alike (or only async_training's)"
        )
    if at.compute_prox_log_prob and cfg.algorithm.rollout_correction.bypass_mode:
        raise ConfigError(
            "async_training.compute_prox_log_prob=True with algorithm.rollout_correction.bypass_mode=True: bypass "
            "takes the engine's log-probs as the old ones, so no proximal ones would be computed; drop one of them"
        )
    actor.use_rollout_log_probs = at.use_rollout_log_probs
    if d.train_batch_size != 0:
        raise ConfigError(
            f"data.train_batch_size={d.train_batch_size} with verl's fully async recipe (async_training.*): its "
            "trainer takes async_training.require_batches x actor_rollout_ref.actor.ppo_mini_batch_size prompts per "
            "update; set data.train_batch_size=0, as verl asserts"
        )
    if d.gen_batch_size not in (None, 1):
        raise ConfigError(
            f"data.gen_batch_size={d.gen_batch_size} with verl's fully async recipe: its rollouter draws one prompt "
            "at a time (verl asserts 1); set data.gen_batch_size=1"
        )
    for key in ("async_training.require_batches", "async_training.trigger_parameter_sync_step"):
        if value_at(cfg, key) < 1:
            raise ConfigError(f"{key}={value_at(cfg, key)} must be at least 1")
    if at.staleness_threshold < 0:
        raise ConfigError(f"async_training.staleness_threshold={at.staleness_threshold} must be 0 or more")
    d.gen_batch_size = 1
    d.train_batch_size = at.require_batches * cfg.actor_rollout_ref.actor.ppo_mini_batch_size


def rollout_pool_defaults(cfg: Config, keys: set[str]) -> None:
    """What verl's one-step-off-policy and fully async recipe configs set, where the user did not: engines on a pool
    of their own stay awake (free_cache_engine=False: they hold their GPUs alone, and a sleeping engine could not take
    weights), and, one step off-policy, with samples generated a step before the weights they train, the PPO ratio is
    taken against the engine's own log-probs (bypass_mode=True) unless a rollout_correction key was given (fully
    async, async_training.use_rollout_log_probs does that)."""
    async_mode_of(cfg, keys)
    if cfg.trainer.async_mode == FULLY_ASYNC:
        fully_async_batches(cfg)
    elif cfg.data.gen_batch_size not in (None, cfg.data.train_batch_size) and not cfg.algorithm.filter_groups.enable:
        raise ConfigError(
            f"data.gen_batch_size={cfg.data.gen_batch_size} differs from data.train_batch_size="
            f"{cfg.data.train_batch_size}: rlrig draws a generation batch of its own only for DAPO's dynamic "
            "sampling; set algorithm.filter_groups.enable=True, or drop data.gen_batch_size"
        )
    if cfg.actor_rollout_ref.hybrid_engine:
        pool_keys = sorted(k for k in keys if k.startswith("rollout."))
        if pool_keys:
            raise ConfigError(
                f"{pool_keys[0]} sizes the rollout pool of actor_rollout_ref.hybrid_engine=False (verl's one-step-off-"
                "policy and fully async recipes set both); set actor_rollout_ref.hybrid_engine=False, or drop the "
                "rollout.* keys"
            )
        return
    if "actor_rollout_ref.rollout.free_cache_engine" not in keys:
        cfg.actor_rollout_ref.rollout.free_cache_engine = False
    mode = cfg.trainer.async_mode
    if mode == "one_step_off_policy" and not any(k.startswith("algorithm.rollout_correction.") for k in keys):
        cfg.algorithm.rollout_correction.bypass_mode = True


def _named(item: str, step):
    """step(), its error naming the file and line of a key from a config file (config/config_files.py)."""
    try:
        return step()
    except ConfigError as e:
        where = getattr(item, "where", None)
        if where:
            raise ConfigError(f"{where}: {e}") from None
        raise


def parse_overrides(overrides: list[str]) -> Config:
    """Overrides applied in order onto verl's defaults (a preset's, if any, come first: see config/presets.py; a
    config file's next: config/config_files.py), `${...}` in values resolved against the final values."""
    cfg = Config()
    # `+key=value` adds a key in Hydra; every key we accept already exists, so it just sets it.
    parsed = [_named(item, lambda item=item: parse_override(item)) for item in overrides]
    resolve = Resolver(parsed)
    keys = set()
    for item, (key, value) in zip(overrides, parsed):
        keys.add(key)
        if verl_keys.filled_by_verl(key, value):
            continue  # verl's own `${...}` for a key it fills from another, which rlrig reads instead
        _named(item, lambda key=key, value=value: set_key(cfg, key, resolve(key, value)))
    a = cfg.actor_rollout_ref.actor
    a.strategy = canonical_strategy(a.strategy)
    rollout_pool_defaults(cfg, keys)
    derive(cfg)
    validate(cfg)
    return cfg
