"""The end of an rlrig process: `rlrig` itself and the trainer's driver."""

from __future__ import annotations

import gc
import sys
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """Exit with `code`, the interpreter's last garbage collection skipped: with torch, transformers and Ray loaded it
    takes about a second at the end of every run and frees nothing the exit does not. Only for a process's own end
    (the `__main__` of a command), never for a function that returns to a caller that goes on. Not where triton is
    loaded (vLLM's installs): its nanobind bindings print every object of theirs still alive at exit as a leak, dozens
    of lines at the end of a clean run."""
    if "triton" not in sys.modules:
        gc.freeze()
    sys.exit(code)


def end_resource_tracker(timeout_s: float) -> None:
    """Stops this process's multiprocessing resource tracker, waiting up to `timeout_s` for it to unlink what it
    tracks. An engine's child processes share it (spawn hands it down), and vLLM leaves the message queues of its
    worker processes (`/dev/shm/psm_*`, 160-250 MB each) for it to unlink once they have all ended. It does so only
    when every holder of its pipe has closed it, so after the children are gone; a Ray worker's end would otherwise
    kill it first (Ray kills an exiting worker's child processes) and the segments outlive the run. Bounded: a
    child that has not ended keeps the tracker waiting, and the worker's end then goes on without it."""
    import threading
    from multiprocessing import resource_tracker

    # _stop is the tracker's own shutdown (CPython 3.8 on): close our end of its pipe, then reap it
    stopping = threading.Thread(target=resource_tracker._resource_tracker._stop, daemon=True)
    stopping.start()
    stopping.join(timeout_s)
