"""Overrides as Hydra reads them, by Hydra's own parser (hydra-core's override grammar): the one reader for the
command line, config files' values and the accepted-default comparisons of verl_keys, so `key=value` means in rlrig
what it means to verl's Hydra entry point. `as_raw` writes a value back as override text the parser reads as it.

What Hydra parses but one config cannot hold is refused in one line: sweeps (`a,b`, `range()`, `glob()`: Hydra's
--multirun), deleting a key (`~key`) and packages (`key@pkg`).
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException
from omegaconf._utils import get_yaml_loader

from ..errors import ConfigError

_PARSER = OverridesParser.create()
# what Hydra takes for a dictionary key written plain: `{enable_thinking:false}`
_PLAIN_KEY = re.compile(r"[A-Za-z_][\w\-]*|\d+")


def _one_line(e: Exception) -> str:
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    return lines[0] if lines else type(e).__name__


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` (Hydra's `+key`/`++key` set it too) as (key, value), the value as Hydra gives it."""
    if "=" not in item and not item.lstrip().startswith("~"):
        raise ConfigError(f"override {item!r} is not KEY=VALUE")
    override = _parse(item)
    if override.type == OverrideType.DEL:
        raise ConfigError(
            f"override {item!r}: `~key` deletes a key in Hydra; every key of verl's config is in rlrig's, so set it "
            "(key=null for none) instead"
        )
    if override.package is not None:
        raise ConfigError(f"override {item!r}: Hydra's @package is for config groups, which rlrig does not compose")
    if override.value_type is None:
        raise ConfigError(f"override {item!r} is not KEY=VALUE")
    return override.key_or_group, _value(override, item)


def parse_literal(raw: str) -> Any:
    """A value's text (`null`, `True`, `1e-6`, `[a,b]`, `{k:v}`, `'quoted'`, `inf`) as Hydra reads it after `key=`."""
    return copy.deepcopy(_literal(raw))  # the cached value is shared; callers may keep and change theirs


def yaml_value(text: str) -> Any:
    """A plain YAML scalar as OmegaConf's loader types it (verl's config files): 1e-6 a float, `~` and nothing
    null, `a,b` text."""
    return yaml.load(text, Loader=get_yaml_loader())


@functools.lru_cache(maxsize=8192)
def _literal(raw: str) -> Any:
    try:
        return _value(_parse(f"_={raw}"), raw)
    except ConfigError as e:
        raise ConfigError(str(e).replace(f"override '_={raw}'", f"value {raw!r}")) from None


@functools.lru_cache(maxsize=8192)
def _parse(item: str) -> Override:
    try:
        return _PARSER.parse_override(item)
    except HydraException as e:
        raise ConfigError(
            f"override {item!r}: Hydra cannot parse it ({_one_line(e)}); quote a value holding spaces, commas or "
            "brackets: key='a,b'"
        ) from None


def _value(override: Override, item: str) -> Any:
    if override.is_sweep_override():
        raise ConfigError(
            f"override {item!r}: Hydra reads this as a sweep (a,b / range() / glob() / choice()), several runs under "
            "--multirun, which rlrig does not do; give one value, a list as [a,b], or quote text holding a comma"
        )
    value = override.value()
    return _plain(value)


def _plain(value: Any) -> Any:
    """Hydra's quoted strings as str, its containers as list and dict."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def as_raw(value: Any) -> str:
    """A value written as override text that parse_literal reads back as the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(as_raw(v) for v in value) + "]"
    if isinstance(value, dict):
        bad = next((k for k in value if not _PLAIN_KEY.fullmatch(str(k))), None)
        if bad is not None:
            raise ConfigError(f"the mapping key {bad!r} cannot be written in Hydra's override grammar; rename it")
        return "{" + ",".join(f"{k}:{as_raw(v)}" for k, v in value.items()) + "}"
    raise ConfigError(f"{value!r}: a {type(value).__name__} has no Hydra override form")


def _string(value: str) -> str:
    try:
        if value and _literal(value) == value:
            return value  # plain where that reads back the same: verl_keys' accepted spellings stay as written
    except ConfigError:
        pass
    # Hydra's quoted string: backslashes escape only a quote or the backslashes right before one
    body = re.sub(r"(\\*)(')", lambda m: m.group(1) * 2 + "\\'", value)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return f"'{body}'"
