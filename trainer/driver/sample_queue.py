"""The fully async mode's bookkeeping, as verl's rollouter and message queue keep it (verl/experimental/
fully_async_policy): how many prompts the engines may start under one weight version, and the queue of finished
prompt groups the trainer takes its updates from. Pure Python: the driver's loop (driver/fully_async.py) moves the
samples, this decides.

A sample here is one prompt with its rollout.n responses (verl's RolloutSample): it is generated, queued, taken
and dropped whole.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Group:
    """One prompt's samples: where the prompt is in the data set, what they are (a Rollout of rollout.n rows), and
    the weight version they come from."""

    index: int
    rollout: object
    version: int  # the weights that finished it (verl's param_version; a partial rollout began under earlier ones)
    span: int = 0  # weight versions a partial rollout's tokens came from, less one (0: one version drew them all)
    turns: list[dict] = field(default_factory=list)  # per sample: the agent loop's fields for the reward ([]: none)
    records: list[dict] = field(default_factory=list)  # per sample: its turn record ([]: none)


class Freshness:
    """verl's freshness control. Between two weight syncs the engines start at most
        max_required = required x (1 + staleness_threshold) x trigger_parameter_sync_step
    prompts, where required = require_batches x ppo_mini_batch_size is what one update takes; at a sync the count
    restarts from the prompts still in flight or queued (verl's staleness_samples), so the excess of one version is
    paid for in the next. The queue holds at most max_required prompts (verl's max_queue_size)."""

    def __init__(self, required: int, staleness_threshold: float, trigger: int):
        self.max_required = int(required * (1 + staleness_threshold) * trigger)
        self.started = 0

    def room(self, queued: int) -> int:
        """Prompts that may start now."""
        if queued >= self.max_required:
            return 0
        return max(0, self.max_required - self.started)

    def start(self, prompts: int) -> None:
        self.started += prompts

    def new_version(self, in_flight: int, queued: int) -> None:
        self.started = in_flight + queued


def stale_bound(staleness_threshold: float) -> int:
    """How many weight versions a sample may lag the trainer's when it is taken: the versions the freshness control
    lets the excess span, ceil(staleness_threshold) (0: every sample from the current weights). A staler one (a
    generation that outlived a sync) is dropped and counted."""
    return math.ceil(staleness_threshold)


class SampleQueue:
    """Finished prompt groups in the order they finished; the trainer takes `required` at a time."""

    def __init__(self, bound: int):
        self.bound = bound
        self.groups: deque[Group] = deque()
        self.dropped = 0  # prompts dropped as staler than the bound

    def __len__(self) -> int:
        return len(self.groups)

    def put(self, groups: list[Group]) -> None:
        self.groups.extend(groups)

    def drop_stale(self, version: int) -> list[Group]:
        """Remove and count the groups more than `bound` versions behind `version`; they are returned so the caller
        can account for their prompts."""
        kept, gone = deque(), []
        for g in self.groups:
            (gone if version - g.version > self.bound else kept).append(g)
        self.groups = kept
        self.dropped += len(gone)
        return gone

    def take(self, required: int) -> list[Group] | None:
        """The oldest `required` groups, or None while fewer are queued."""
        if len(self.groups) < required:
            return None
        return [self.groups.popleft() for _ in range(required)]

    def indices(self) -> list[int]:
        return [g.index for g in self.groups]
