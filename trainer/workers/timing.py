"""The named phases of a step, timed under verl's `timing_s/<phase>` names."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from contextlib import contextmanager

# every phase a worker's step runs (the training worker's, in their order), and the two the head times around
# the workers' calls; the watchdog (driver/watchdog.py) watches each by these names
PHASES = (
    "gen",
    "reward",
    "gen_max",
    "balance",
    "sp_share",
    "old_log_prob",
    "ref",
    "teacher",
    "values",
    "adv",
    "pf_ppo",
    "update_critic",
    "update_actor",
    "update_weights",
    "testing",
    "save_checkpoint",
    # a rollout pool's own (workers/rollout_worker.py): its generation and the weights it takes
    "rollout_gen",
    "sync_rollout_weights",
)


def device_sync(device) -> Callable[[], None]:
    """What Phases waits for around a phase on `device` (a torch.device): its queued CUDA work; nothing on the CPU,
    whose ops are done when they return."""
    if device.type == "cuda":
        import torch

        return functools.partial(torch.cuda.synchronize, device)
    return lambda: None


class Phases:
    """`with phases("gen"): ...` adds the block's seconds to timing_s/gen. `sync` waits for queued device
    work first (CUDA runs asynchronously: without it a phase's kernels would be billed to the next one). `mark`
    brackets each phase from outside its timing (the profiler's range or recording: workers/profiling.py).
    `enter` is told each phase's name as it starts (the head's watchdog: workers/phase_report.py)."""

    def __init__(
        self,
        sync: Callable[[], None] = lambda: None,
        mark=lambda name: contextlib.nullcontext(),
        enter: Callable[[str], None] = lambda name: None,
    ):
        self.sync, self.mark, self.enter, self.seconds = sync, mark, enter, {}

    @contextmanager
    def __call__(self, name: str):
        self.enter(name)
        with self.mark(name):
            self.sync()
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.sync()
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.seconds.items()}
