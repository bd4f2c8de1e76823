"""How rlrig takes each leaf key of a verl release's trainer config, given alone at verl's default: the count of keys
in each class and the keys rlrig does not know.

The classes, decided in the order rlrig's parser decides (trainer/config/overrides.py):

- not-given: verl reads the value as absent (OmegaConf's `???`, or an old reward key at null), so nothing is set;
- interpolated: verl's own `${...}` for a key verl fills from another one, which rlrig reads instead
  (verl_keys.FILLED);
- no-effect: accepted at any value because it changes nothing for rlrig (verl_keys.NO_EFFECT);
- default-only: accepted at verl's default, which asks for nothing rlrig lacks; another value is refused in one line;
- implemented: a key of rlrig's config, one of its aliases, or an item of a mapping rlrig takes whole;
- refused: refused at verl's default too, in one line with the reason (verl's Megatron keys, for one);
- unknown: "unknown config key". No key of a release rlrig tracks may answer it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from rlrig.trainer.config import verl_keys
from rlrig.trainer.config.interpolation import Resolver
from rlrig.trainer.config.literals import as_raw, parse_override
from rlrig.trainer.config.overrides import set_key
from rlrig.trainer.config.schema import Config, all_keys
from rlrig.trainer.errors import ConfigError

CLASSES = ("implemented", "default-only", "no-effect", "interpolated", "not-given", "refused", "unknown")
# a value no key takes as its default: a key that refuses it is taken at its default only
_ANOTHER = "rlrig-report-another-value"


@dataclasses.dataclass(frozen=True)
class Report:
    """One table's keys by class (CLASSES); `unknown` lists the keys that answer "unknown config key"."""

    name: str
    by_key: dict[str, str]

    def count(self, cls: str) -> int:
        return sum(1 for c in self.by_key.values() if c == cls)

    @property
    def unknown(self) -> list[str]:
        return sorted(k for k, c in self.by_key.items() if c == "unknown")

    def text(self) -> str:
        counts = "\n".join(f"  {cls:<13}{self.count(cls):>5}" for cls in CLASSES)
        unknown = "".join(f"\n    {k}" for k in self.unknown)
        return f"{self.name}: {len(self.by_key)} leaf keys\n{counts}{unknown}"


def report(name: str, defaults: Iterable[tuple[str, str | None]]) -> Report:
    """Each (key, verl's default as override text, or None where the table has none) classified."""
    return Report(name, {key: classify(key, text) for key, text in defaults})


def classify(key: str, text: str | None) -> str:
    """The class (CLASSES) of `rlrig train KEY=TEXT` alone; a key with no default is given rlrig's own, else null."""
    if text is None:
        text = _rlrig_default(key)
    try:
        value = _parsed(key, text)
        if verl_keys.filled_by_verl(key, value):
            return "interpolated"
        value = Resolver([(key, value)])(key, value)
        if verl_keys.not_given(key, value):
            return "not-given"
        set_key(Config(), key, value)
    except ConfigError as e:
        return "unknown" if str(e).startswith("unknown config key") else "refused"
    return _why_taken(verl_keys.aliased(key))


def _parsed(key: str, text: str):
    try:
        return parse_override(f"{key}={text}")[1]
    except ConfigError as e:
        if "Hydra" not in str(e):
            raise
        # a path (~/...) or a list of names (a,b) that Hydra's command line wants quoted, as a YAML file gives it
        return parse_override(f"{key}='{text}'")[1]


def _why_taken(key: str) -> str:
    """Why a key rlrig took at verl's default is taken."""
    if key in verl_keys.NO_EFFECT:
        return "no-effect"
    if verl_keys.refusal(key, _ANOTHER) is not None or not _in_config(key):
        return "default-only"
    return "implemented"


def _in_config(key: str) -> bool:
    """A field of rlrig's config, or an item under a mapping field (reward_model.reward_kwargs.overlong_buffer_cfg)."""
    cfg = Config()
    if key in all_keys(cfg):
        return True
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        obj = cfg
        for p in parts[:cut]:
            obj = getattr(obj, p, None)
        if isinstance(obj, dict):
            return True
    return False


def _rlrig_default(key: str) -> str:
    obj = Config()
    for part in verl_keys.aliased(key).split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
    return as_raw(obj)
