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
import threading
import time

NAMESPACE = "rlrig_phases"
STACK_SIGNAL = signal.SIGUSR2  # SIGUSR1 is the preemption warning; Ray's workers leave SIGUSR2 alone
IDLE = ""  # between calls: waiting for the head, which is no hang of the worker's
PUBLISH_S = 0.25  # the least time between two puts of a worker's phase (the watchdog polls every second)


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
    returns to the head. Both only note where the worker is; a thread of the worker's puts the latest note into the
    store, at most every `PUBLISH_S`, so a phase costs the step no round trip to the cluster's store (a step's eight
    on two CPU cores took 12 ms of a 0.13 s step). The watchdog polls every second and times a phase from when it
    first sees it, so a phase shorter than the interval may go unseen, as one shorter than a poll always could;
    a phase that hangs is seen. `fault`: the phase in which RLRIG_FAULT_HANG makes this worker hang
    (driver/faults.py)."""

    def __init__(self, label: str):
        import ray
        from ray.experimental import internal_kv

        self.fault: str | None = None
        self.entered = 0  # phases entered: a call that enters the phase and step it just left is another one
        self.entry: tuple[str, int, int] = (IDLE, 0, 0)  # (phase, step, entered) as last noted
        self.published: tuple[str, int, int] | None = None  # what the store holds
        self.changed = threading.Event()
        self.failed: Exception | None = None  # the publishing thread's error, raised in the worker's next phase
        # a worker without Ray (driver/single_process.py: the GPU tests, the benchmarks) has no head to tell, and
        # asking Ray for the job would start a local cluster
        self.kv = internal_kv if ray.is_initialized() else None
        self.key = key(ray.get_runtime_context().get_job_id(), label) if self.kv else b""
        if self.kv is not None:
            self.start_publishing()

    def start_publishing(self, interval: float = PUBLISH_S) -> None:
        """The thread that puts each new note into the store, then waits `interval` (later notes replace it)."""

        def run() -> None:
            try:
                while True:
                    self.changed.wait()
                    self.changed.clear()
                    self.publish()
                    time.sleep(interval)
            except Exception as e:  # the store is gone: the worker's next phase raises it
                self.failed = e

        threading.Thread(target=run, name="rlrig-phase-report", daemon=True).start()

    def publish(self) -> None:
        """The latest note into the store, unless the store holds it already."""
        entry = self.entry
        if self.kv is None or entry == self.published:
            return
        phase, step, entered = entry
        value = json.dumps({"phase": phase, "step": step, "entered": entered}).encode()
        self.kv._internal_kv_put(self.key, value, overwrite=True, namespace=NAMESPACE)
        self.published = entry

    def _note(self, phase: str, step: int) -> None:
        if self.failed is not None:
            raise self.failed
        self.entry = (phase, step, self.entered)
        self.changed.set()

    def enter(self, phase: str, step: int) -> None:
        self.entered += 1
        self._note(phase, step)
        # "collective": this rank stays out of the update's collectives, so its peers block inside the first one
        if self.fault is not None and self.fault in (phase, "collective" if phase == "update_actor" else None):
            self.fault = None
            hang_forever()

    def leave(self) -> None:
        self._note(IDLE, 0)

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
