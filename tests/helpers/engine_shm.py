"""The shared memory vLLM's CPU engines hold in /dev/shm while they run: the tensor-parallel groups' segments
(`*cpushm*`), the message queues between an engine and its worker processes (Python's `psm_*`) and their locks
(`sem.mp-*`). vLLM unlinks them as its processes end normally; an engine killed with its worker leaves them for
good (hundreds of MB each), and the next tensor-parallel engine on the node cannot start beside a stale group
segment. A test of a run takes `segments()` before it and asserts `left_behind(before)` is empty after: the segments
made since that no live process holds, so that an engine of another test running beside it (pytest-xdist) is not
taken for a leak."""

from __future__ import annotations

import contextlib
import glob
import os
import time

PATTERNS = ("/dev/shm/*cpushm*", "/dev/shm/psm_*", "/dev/shm/sem.mp-*")


def segments() -> set[str]:
    return {path for pattern in PATTERNS for path in glob.glob(pattern)}


def held() -> set[str]:
    """The /dev/shm files some live process maps or has open."""
    found = set()
    for proc in glob.glob("/proc/[0-9]*"):
        with contextlib.suppress(OSError):
            with open(f"{proc}/maps") as maps:
                found.update(line.split(maxsplit=5)[5].strip() for line in maps if "/dev/shm/" in line)
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"{proc}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"{proc}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        found.add(target)
    return found


def left_behind(before: set[str], wait_s: float = 0.0) -> set[str]:
    """The segments made since `before` that are still there and held by no live process, after up to `wait_s` for
    processes that finish exiting after the run's command has returned (and for Python's resource tracker, which
    unlinks what a process it watched left)."""
    deadline = time.monotonic() + wait_s
    while (orphans := (segments() - before) - held()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return orphans
