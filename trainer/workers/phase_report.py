"""What a worker tells the head's watchdog (driver/watchdog.py): the phase of the step it is in, as one entry in
the Ray cluster's key-value store that the head polls. Also the worker's own stack dump on a signal, for nodes
where py-spy cannot read another process (a container without ptrace), and the test suite's injected hangs."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import tempfile
import time

NAMESPACE = "rlrig_phases"
STACK_SIGNAL = signal.SIGUSR2  # SIGUSR1 is the preemption warning; Ray's workers leave SIGUSR2 alone
IDLE = ""  # between calls: waiting for the head, which is no hang of the worker's


def key(job_id: str, label: str) -> bytes:
    return f"{job_id}/{label}".encode()


def stack_file(pid: int) -> str:
    """Where worker `pid` writes its stack on STACK_SIGNAL (on its own node): the node's Ray temp dir, which rlrig
    makes per job and node (RAY_TMPDIR reaches every Ray process there), so the files go with the job's."""
    return os.path.join(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), f"rlrig-stack-{pid}.txt")


def install_stack_dump() -> None:
    """Every thread's Python stack into stack_file() on STACK_SIGNAL, from the signal handler itself, so even a
    worker blocked in a C call (a collective) answers."""
    f = open(stack_file(os.getpid()), "w")  # noqa: SIM115 - faulthandler writes to it for the process's life
    faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)


class PhaseReport:
    """`enter(phase, step)` as a phase starts (workers/timing.Phases calls it), `leave()` when the worker's call
    returns to the head. `fault`: the phase in which RLRIG_FAULT_HANG makes this worker hang (driver/faults.py)."""

    def __init__(self, label: str):
        import ray
        from ray.experimental import internal_kv

        self.fault: str | None = None
        self.entered = 0  # phases entered: a call that enters the phase and step it just left is another one
        # a worker without Ray (driver/single_process.py: the GPU tests, the benchmarks) has no head to tell, and
        # asking Ray for the job would start a local cluster
        self.kv = internal_kv if ray.is_initialized() else None
        self.key = key(ray.get_runtime_context().get_job_id(), label) if self.kv else b""

    def _put(self, phase: str, step: int) -> None:
        if self.kv is None:
            return
        entry = json.dumps({"phase": phase, "step": step, "entered": self.entered}).encode()
        self.kv._internal_kv_put(self.key, entry, overwrite=True, namespace=NAMESPACE)

    def enter(self, phase: str, step: int) -> None:
        self.entered += 1
        self._put(phase, step)
        # "collective": this rank stays out of the update's collectives, so its peers block inside the first one
        if self.fault is not None and self.fault in (phase, "collective" if phase == "update_actor" else None):
            self.fault = None
            hang_forever()

    def leave(self) -> None:
        self._put(IDLE, 0)

    @contextlib.contextmanager
    def during(self, phase: str, step: int):
        """A call of the head's that is one phase as a whole (validation, a checkpoint's gathering, a weight sync)."""
        self.enter(phase, step)
        try:
            yield
        finally:
            self.leave()


def hang_forever() -> None:
    """An injected hang: alive, answering signals, never returning."""
    while True:
        time.sleep(1)
