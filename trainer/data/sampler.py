"""The order in which training prompts are drawn: shuffled each epoch from data.seed, with a position a
checkpoint restores."""

from __future__ import annotations

import random


class Sampler:
    """Epoch-shuffled prompt order with a position that checkpoints can restore. Also the interface the driver draws
    through (CustomSampler has it too): next() gives each step's row indices, steps_per_epoch() the whole batches of
    an epoch, `epoch` and `pos` (indices drawn in the epoch) are what a checkpoint saves and sets back, and
    `curriculum` says whether the sampler takes each step's batch after the step."""

    curriculum = False  # it takes no step's batch (data/custom_sampler.py's may)

    def __init__(self, n: int, batch: int, seed: int, shuffle: bool):
        self.n, self.batch, self.seed, self.shuffle = n, batch, seed, shuffle
        self.epoch, self.pos = 0, 0
        self._drawing: tuple[int, list[int]] | None = None  # (epoch, its order): shuffled once an epoch, not a draw

    def order(self) -> list[int]:
        """This epoch's order of the n rows: shuffled from data.seed + the epoch, or as they are."""
        idx = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(idx)
        return idx

    def next(self) -> list[int]:
        """The next batch's row indices; an epoch's last rows that do not fill a batch are skipped (drop_last)."""
        if self.pos + self.batch > self.n:
            self.epoch, self.pos = self.epoch + 1, 0
        if self._drawing is None or self._drawing[0] != self.epoch:  # a new epoch, or a checkpoint's restored
            self._drawing = (self.epoch, self.order())
        out = self._drawing[1][self.pos : self.pos + self.batch]
        self.pos += self.batch
        return out

    def steps_per_epoch(self) -> int:
        """Whole batches in an epoch."""
        return self.n // self.batch
