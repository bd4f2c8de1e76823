"""Preemption: SIGTERM or SIGUSR1 (Slurm's `--signal=B:USR1@...` warning, a pod's termination) asks the
trainer to stop; it finishes the step in flight, writes a checkpoint and exits with 128 + the signal, so
a relaunch resumes at the next step instead of at the last periodic checkpoint."""

from __future__ import annotations

import json
import os
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
