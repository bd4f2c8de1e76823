"""The order in which training prompts are drawn: shuffled each epoch from data.seed, with a position a
checkpoint restores."""

from __future__ import annotations

import random


class Sampler:
    """Epoch-shuffled prompt order with a position that checkpoints can restore."""

    curriculum = False  # it takes no step's batch (data/custom_sampler.py's may)

    def __init__(self, n: int, batch: int, seed: int, shuffle: bool):
        self.n, self.batch, self.seed, self.shuffle = n, batch, seed, shuffle
        self.epoch, self.pos = 0, 0

    def order(self) -> list[int]:
        idx = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(idx)
        return idx

    def next(self) -> list[int]:
        if self.pos + self.batch > self.n:
            self.epoch, self.pos = self.epoch + 1, 0
        out = self.order()[self.pos : self.pos + self.batch]
        self.pos += self.batch
        return out

    def steps_per_epoch(self) -> int:
        return self.n // self.batch
