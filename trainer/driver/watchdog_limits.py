"""How long a phase of a step may run before the head's watchdog calls it a hang (driver/watchdog.py): arithmetic
only, so it is tested by hand."""

from __future__ import annotations

import statistics

from ..config.schema import WATCHDOG_MARGIN_S as MARGIN_S

FIRST_RUN = 3  # a phase's first run (allocator and caches warming, an engine's first batch) gets 3 x the floor


def phase_limit(durations: list[float], factor: float, floor: float, nccl_timeout: float) -> float:
    """Seconds a phase may run: max(factor x median(its earlier durations), floor), or FIRST_RUN x floor before it
    has finished once; never above nccl_timeout - MARGIN_S."""
    limit = max(factor * statistics.median(durations), floor) if durations else FIRST_RUN * floor
    return min(limit, nccl_timeout - MARGIN_S)


def explain(durations: list[float], factor: float, floor: float, nccl_timeout: float) -> str:
    """Where a limit came from, for the hang's one line."""
    if phase_limit(durations, factor, floor, nccl_timeout) == nccl_timeout - MARGIN_S:
        return f"actor_rollout_ref.nccl_timeout {nccl_timeout:g}s - {MARGIN_S:g}s"
    if not durations:
        return f"its first run: {FIRST_RUN} x trainer.watchdog_min_s {floor:g}s"
    return f"max({factor:g} x median {statistics.median(durations):.2f}s, {floor:g}s)"
