"""The shared memory vLLM's CPU engines hold in /dev/shm while they run: the tensor-parallel groups' segments
(`*cpushm*`), the message queues between an engine and its worker processes (Python's `psm_*`) and their locks
(`sem.mp-*`). vLLM unlinks them as its processes end normally; an engine killed with its worker leaves them for
good (hundreds of MB each), and the next tensor-parallel engine on the node cannot start beside a stale group
segment. A test of a run takes `segments()` before it and asserts `left_behind(before)` is empty after."""

from __future__ import annotations

import glob
import time

PATTERNS = ("/dev/shm/*cpushm*", "/dev/shm/psm_*", "/dev/shm/sem.mp-*")


def segments() -> set[str]:
    return {path for pattern in PATTERNS for path in glob.glob(pattern)}


def left_behind(before: set[str], wait_s: float = 0.0) -> set[str]:
    """The segments made since `before` that are still there, after up to `wait_s` for processes that finish
    exiting after the run's command has returned."""
    deadline = time.monotonic() + wait_s
    while (new := segments() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    return new
