"""OmegaConf's `${...}` in override values, resolved as verl's composed config resolves them: against the final
value of the key named (the last override that sets it, else rlrig's default), whichever override came first.

Two forms are taken: `${a.b.c}` (absolute) and `${oc.select:a.b.c,default}`; relative keys (`${.x}`) and other
resolvers are refused in one line. A value that is one interpolation takes the referenced value with its type;
one with text around it becomes a string, as in OmegaConf.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ..errors import ConfigError
from .literals import parse_literal
from .schema import Config
from .verl_keys import ALIASES

INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


def as_raw(value: Any) -> str:
    """A value written as override text that parse_literal reads back as the same value."""
    if value is None:
        return "null"
    if isinstance(value, str):
        # plain where that round-trips, so verl_keys' accepted-default spellings still match
        return value if parse_literal(value) == value else repr(value)
    return str(value) if isinstance(value, bool) else repr(value)


def canonical(key: str) -> str:
    key = key.lstrip("+").strip()
    return ALIASES.get(key, key)


def _default(key: str, defaults: Config) -> tuple[bool, Any]:
    obj: Any = defaults
    for part in key.split("."):
        if isinstance(obj, dict):
            if part not in obj:
                return False, None
            obj = obj[part]
        elif dataclasses.is_dataclass(obj) and part in {f.name for f in dataclasses.fields(obj)}:
            obj = getattr(obj, part)
        else:
            return False, None
    return True, obj


class Resolver:
    """Built over the whole list of overrides, since a reference reads the final value of its key."""

    def __init__(self, overrides: list[str]):
        self.final = {canonical(k): raw for k, raw in (o.split("=", 1) for o in overrides if "=" in o)}
        self.defaults = Config()

    def __call__(self, key: str, raw: str) -> str:
        return self._resolve(canonical(key), raw, ())

    def _resolve(self, key: str, raw: str, chain: tuple[str, ...]) -> str:
        if "${" not in raw:
            return raw
        whole = INTERPOLATION.fullmatch(raw.strip())
        if whole:
            return self._lookup(key, whole.group(1), chain)
        text = parse_literal(raw)
        if not isinstance(text, str):
            raise ConfigError(f"{key}={raw}: interpolations go in a whole value or a string, not in a list")
        out = INTERPOLATION.sub(lambda m: str(parse_literal(self._lookup(key, m.group(1), chain))), text)
        if "${" in out:
            raise ConfigError(f"{key}={raw}: nested or unclosed interpolation; write ${{a.b}} or ${{oc.select:a.b,v}}")
        return as_raw(out)

    def _lookup(self, key: str, ref: str, chain: tuple[str, ...]) -> str:
        """The referenced value as override text."""
        ref = ref.strip()
        fallback = None
        if ref.startswith("oc.select:"):
            name, _, fallback = ref[len("oc.select:") :].partition(",")
            ref, fallback = name.strip(), fallback.strip() or "null"
        elif ":" in ref:
            raise ConfigError(
                f"{key}: ${{{ref}}}: the resolver {ref.split(':')[0]} is not in rlrig; "
                "it resolves ${a.b} and ${oc.select:a.b,default}"
            )
        if ref.startswith(".") or not ref:
            raise ConfigError(f"{key}: ${{{ref}}}: relative interpolations are not in rlrig; name the key from the top")
        ref = canonical(ref)
        if ref in chain or ref == key:
            raise ConfigError(f"{key}: ${{{ref}}} refers back to itself")
        if ref in self.final:
            return self._resolve(ref, self.final[ref], (*chain, key))
        found, value = _default(ref, self.defaults)
        if found:
            return as_raw(value)
        if fallback is not None:
            return fallback
        raise ConfigError(f"{key}: ${{{ref}}} names a key rlrig does not have and nothing sets it")
