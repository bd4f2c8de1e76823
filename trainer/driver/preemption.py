"""What the trainer does to survive failures. Preemption: SIGTERM or SIGUSR1 (Slurm's `--signal=USR1@...` warning,
a pod's termination) asks the trainer to stop; it finishes the step in flight, writes a checkpoint and exits with
128 + the signal, so a relaunch resumes at the next step instead of at the last periodic checkpoint. Restarts: a
resumed run logs no step twice and counts the entrypoint's restarts in place; the fabric check's report is kept
with the run."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Records the first stop signal; the training loop checks it between steps."""

    def __init__(self):
        self.signum: int | None = None
        for s in SIGNALS:
            signal.signal(s, self._handle)

    def _handle(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"\nrlrig.train: {signal.Signals(signum).name}: finishing this step, then a checkpoint", flush=True)

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or 0)


RESTARTS_ENV = "RLRIG_RESTARTS"  # set by the entrypoint (restarts.RESTARTS_ENV) on each run of the command


def restarts() -> int:
    """How many times `rlrig run/train --max-restarts` has restarted this run in place after a node's loss: logged
    as `training/restarts` with every step, so a restart shows in the metrics where it happened."""
    text = os.environ.get(RESTARTS_ENV, "0")
    return int(text) if text.isdigit() else 0


def keep_fabric_report(out: Path) -> None:
    """The entrypoint's fabric check (several nodes) leaves its report in the head's Ray temp dir and names it in
    RLRIG_FABRIC_REPORT; a copy beside the run's metrics keeps it with the run (the temp dir goes with the job)."""
    report = os.environ.get("RLRIG_FABRIC_REPORT", "")
    if report and os.path.isfile(report):
        shutil.copyfile(report, out / "fabric.json")


def truncate_metrics(path: Path, step: int) -> int:
    """Keep only the rows up to `step` (a resumed run writes the later ones again): no step logged twice.
    Returns how many rows were dropped."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("training/global_step", 0) <= step]
    if len(kept) == len(lines):
        return 0
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return len(lines) - len(kept)
