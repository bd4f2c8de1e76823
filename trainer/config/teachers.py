"""The distillation teachers of a run, as verl 0.9 resolves them (DistillationConfig._resolve_teacher_models): the one
`teacher_model`, keyed "default", which scores every sample; or, where teachers are named beside it
(`distillation.teacher_models.<name>.*`), those, each keyed by its own `key`, which score the samples whose
`distillation.teacher_key` field (default data_source) holds that key.

Each teacher is seen through a config of its own, the run's with teacher_model replaced by it, so what reads the one
teacher (its engine, its pool, its checks) reads each alike."""

from __future__ import annotations

import copy
from dataclasses import dataclass

TEACHERS = "distillation.teacher_models"


@dataclass(frozen=True)
class Teacher:
    """One teacher: `name`, its entry under distillation.teacher_models; `key`, the teacher_key value of the samples
    it scores ("default" for the one teacher, which scores all); `cfg`, the run's config as it sees it."""

    name: str
    key: str
    cfg: object

    @property
    def prefix(self) -> str:
        """Its keys' prefix, for messages."""
        return f"{TEACHERS}.{self.name}"


def teachers(cfg) -> list[Teacher]:
    """The run's teachers in the order named (one: teacher_model). Assumes the config passed validation."""
    tm = cfg.distillation.teacher_models
    if not tm.named:
        return [Teacher("teacher_model", "default", cfg)]
    return [Teacher(name, t.key, seen_as(cfg, t)) for name, t in tm.named.items()]


def seen_as(cfg, teacher):
    """The run's config with `teacher` as its teacher_model and no other."""
    view = copy.copy(cfg)
    view.distillation = copy.copy(cfg.distillation)
    view.distillation.teacher_models = copy.copy(cfg.distillation.teacher_models)
    view.distillation.teacher_models.teacher_model, view.distillation.teacher_models.named = teacher, {}
    return view


def renamed(message: str, teacher: Teacher) -> str:
    """A message about teacher_model's keys, naming the teacher's own."""
    return message.replace(f"{TEACHERS}.teacher_model.", f"{teacher.prefix}.")


def route_refusal(cfg, values) -> str | None:
    """Why samples whose teacher_key fields hold `values` cannot all be scored (a value no teacher's key is), in one
    line; None with one teacher, which scores every sample, as verl's."""
    found = teachers(cfg)
    if len(found) == 1:
        return None
    keys = [t.key for t in found]
    missing = sorted({repr(v) for v in values if v is None or str(v) not in keys})
    if not missing:
        return None
    field = cfg.distillation.teacher_key
    return (
        f"distillation.teacher_key={field}: samples with {field} {', '.join(missing)} match no teacher (the teachers' "
        f"keys: {', '.join(map(repr, keys))}); give each a teacher with that key ({TEACHERS}.<name>.key)"
    )
