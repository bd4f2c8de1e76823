"""Every field of the typed config is read by the trainer: a key rlrig stores is a key it acts on. A verl key that
changes nothing for rlrig is accepted without a field (verl_keys.NO_EFFECT) and one it does not implement is refused;
neither is stored. The scan is of names, so it catches a field nothing mentions, not one mentioned and still unused."""

import dataclasses
import re
from pathlib import Path

import rlrig.trainer as trainer_pkg
from rlrig.trainer.config import schema, verl_keys
from rlrig.trainer.config.overrides import all_keys

ROOT = Path(trainer_pkg.__file__).parent
SOURCE = "\n".join(p.read_text() for p in ROOT.rglob("*.py") if p != ROOT / "config" / "schema.py")


def fields():
    for name, cls in vars(schema).items():
        if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == schema.__name__:
            yield from ((name, f.name) for f in dataclasses.fields(cls))


def test_every_config_field_is_read_outside_the_schema():
    # attribute access (cfg.data.seed) or the name in a string (derived.py's key tables, getattr by name)
    unread = [f"{c}.{f}" for c, f in fields() if not re.search(rf"\.{f}\b|[\"']{f}[\"'.]", SOURCE)]
    assert unread == []


def test_no_key_that_changes_nothing_is_stored():
    known = set(all_keys(schema.Config()))
    read = {"actor_rollout_ref.rollout.mode", "actor_rollout_ref.rollout.multi_turn.enable"}  # checked at start
    assert sorted(k for k in verl_keys.NO_EFFECT if k in known and k not in read) == []
    assert sorted(k for k in verl_keys.REFUSED if k in known) == []
