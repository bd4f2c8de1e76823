"""OmegaConf's `${...}` in override values, resolved by OmegaConf as verl's composed config resolves them: against
the final value of the key named (the last override that sets it, else rlrig's default), whichever override came
first. Everything OmegaConf resolves is taken: `${a.b}`, relative `${.x}` and `${..y}`, and its own resolvers
(`${oc.env:VAR}`, `${oc.env:VAR,default}`, `${oc.select:a.b,default}`, `${oc.decode:...}`, ...); what it cannot
resolve is one line naming the key and OmegaConf's reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import ConfigError
from .literals import as_raw
from .schema import Config
from .verl_keys import ALIASES

__all__ = ["Resolver", "as_raw", "canonical"]


def canonical(key: str) -> str:
    key = key.lstrip("+").strip()
    return ALIASES.get(key, key)


def has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, list):
        return any(has_interpolation(v) for v in value)
    if isinstance(value, dict):
        return any(has_interpolation(v) for v in value.values())
    return False


class Resolver:
    """Built over the whole list of overrides (key, value as Hydra parsed it), since a reference reads the final
    value of its key. The OmegaConf tree of rlrig's defaults is built only when some value interpolates."""

    def __init__(self, overrides: list[tuple[str, Any]]):
        self.overrides = [(canonical(k), v) for k, v in overrides]
        self._tree: DictConfig | None = None

    def __call__(self, key: str, value: Any) -> Any:
        if not has_interpolation(value):
            return value
        key = canonical(key)
        try:
            node = OmegaConf.select(self.tree, key, throw_on_missing=True)
            if isinstance(node, (DictConfig, ListConfig)):
                return OmegaConf.to_container(node, resolve=True)
            return node
        except OmegaConfBaseException as e:
            reason = next((x.strip() for x in str(e).splitlines() if x.strip()), type(e).__name__)
            raise ConfigError(f"{key}: {as_raw(value)}: {reason}") from None

    @property
    def tree(self) -> DictConfig:
        if self._tree is None:
            self._tree = self._build()
        return self._tree

    def _build(self) -> DictConfig:
        tree = OmegaConf.create(_containers(dataclasses.asdict(Config())))
        for old, new in ALIASES.items():  # an old spelling refers to the key it names
            _put(tree, old, "${" + new + "}")
        for key, value in self.overrides:
            _put(tree, key, value)
        return tree


def _put(tree: DictConfig, key: str, value: Any) -> None:
    try:
        OmegaConf.update(tree, key, value, merge=False, force_add=True)
    except OmegaConfBaseException:
        pass  # a key below a value rlrig holds as a leaf: unknown to rlrig, which set_key says in its own words


def _containers(value: Any) -> Any:
    """rlrig's defaults as plain containers and the scalars OmegaConf holds."""
    if isinstance(value, dict):
        return {str(k): _containers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_containers(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
