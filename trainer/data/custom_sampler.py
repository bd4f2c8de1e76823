"""A sampler class of the user's own (data.sampler.class_path and .class_name, verl's): built as verl builds it,
cls(data_source=<the training rows>, data_config=<the data config>), and drawn from as verl's data loader draws:
data.train_batch_size indices at a time, whole batches only (drop_last), its iterator started anew each epoch.

data_source is the list of training rows (its length, each row by index), where verl hands its RLHFDataset. A
curriculum sampler (one with update(batch), verl's AbstractCurriculumSampler) is handed each step's batch after the
step, as verl's trainer hands it (driver/curriculum.py). verl asserts data.dataloader_num_workers=0 beside a custom
sampler, lest worker processes read ahead of it; rlrig has no such processes, so it takes any value."""

from __future__ import annotations

from itertools import islice
from pathlib import Path

from ..errors import ConfigError
from .custom_dataset import data_section
from .extern import load_object
from .sampler import Sampler

KEYS = "data.sampler.class_path/class_name"
STATE_FILE = "sampler.pt"  # in a checkpoint's step directory


class CustomSampler:
    """Sampler's interface (data/sampler.py) over the user's sampler: the epoch, and the position in it (indices
    drawn), which a checkpoint saves. Restored, the epoch's iterator starts anew and skips the position's indices,
    as verl's StatefulDataLoader does for a sampler without state_dict."""

    def __init__(self, user, n: int, batch: int, name: str):
        self.user, self.n, self.batch, self.name = user, n, batch, name
        self.epoch, self.pos = 0, 0
        self._it, self._at = None, None  # the epoch's iterator, and the (epoch, pos) it stands at

    def next(self) -> list[int]:
        """The user's sampler's next batch of indices; a ConfigError where it yields fewer than a batch in an epoch
        or something that is not a row index."""
        if self._at != (self.epoch, self.pos):  # the first draw, or a checkpoint's position restored
            self._it = islice(iter(self.user), self.pos, None)
        out = list(islice(self._it, self.batch))
        if len(out) < self.batch:  # the epoch's last indices do not fill a batch: dropped, as drop_last
            self.epoch, self.pos = self.epoch + 1, 0
            self._it = iter(self.user)
            out = list(islice(self._it, self.batch))
            if len(out) < self.batch:
                raise ConfigError(f"{KEYS}: {self.name} yielded {len(out)} indices in an epoch, fewer than a batch")
        bad = [i for i in out if not isinstance(i, int) or not 0 <= i < self.n]
        if bad:
            raise ConfigError(f"{KEYS}: {self.name} yielded {bad[0]!r}, not an index of the {self.n} training rows")
        self.pos += self.batch
        self._at = (self.epoch, self.pos)
        return out

    def steps_per_epoch(self) -> int:
        """Whole batches in an epoch of the user's sampler (its len)."""
        return len(self.user) // self.batch

    def state(self):
        """The user's sampler's own state (its state_dict, where it has one; a curriculum's weights, say)."""
        return self.user.state_dict() if callable(getattr(self.user, "state_dict", None)) else None

    @staticmethod
    def save(state, step_dir: Path) -> None:
        """Writes a state() taken at the step into the checkpoint's step directory, which the checkpoint names only
        when it writes."""
        import torch

        torch.save(state, step_dir / STATE_FILE)

    def restore(self, step_dir: Path) -> None:
        """The state a checkpoint saved, into a sampler with load_state_dict (a checkpoint without it: none)."""
        import torch

        f = step_dir / STATE_FILE
        if not f.exists():
            return
        if not callable(getattr(self.user, "load_state_dict", None)):
            raise ConfigError(f"{KEYS}: {f} holds a sampler's state and {self.name} has no load_state_dict")
        self.user.load_state_dict(torch.load(f, weights_only=False))

    @property
    def curriculum(self) -> bool:
        """verl's AbstractCurriculumSampler: it takes each step's batch (update)."""
        return callable(getattr(self.user, "update", None))


def make_sampler(data_cfg, rows: list[dict], batch: int) -> Sampler | CustomSampler:
    """The training prompts' order: the user's sampler where data.sampler.class_path names one, else rlrig's
    epoch-shuffled one (data.shuffle, data.seed)."""
    s = data_cfg.sampler
    if not s.class_path:
        return Sampler(len(rows), batch, data_cfg.seed, data_cfg.shuffle)
    cls = load_object(s.class_path, s.class_name, KEYS)
    try:
        user = cls(data_source=rows, data_config=data_section(data_cfg))
    except TypeError as e:  # verl's signature: the class takes data_source and data_config
        raise ConfigError(f"{KEYS}: {s.class_name}(data_source=..., data_config=...) failed: {e}") from None
    if not hasattr(user, "__iter__") or not hasattr(user, "__len__"):
        raise ConfigError(f"{KEYS}: {s.class_name} must be a torch.utils.data.Sampler (iterable, with a length)")
    return CustomSampler(user, len(rows), batch, s.class_name)
