"""The head's watchdog: a worker that is alive but makes no progress (a collective a peer never joins, a stuck
engine, a reward function that never returns) would otherwise be waited on forever.

Each training worker says which phase of which step it is in (workers/phase_report.py); a thread here polls that
once a second and times each phase from when it first saw it. A phase past its limit (watchdog_limits.py) is a
hang: every worker's stack goes to <run dir>/hang-step<N>/, the stuck rank's into the log, one line names the
rank, its node and the phase, the workers are killed and the driver exits with HANG_EXIT, on which
`rlrig train --max-restarts` runs the command again from the last checkpoint."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import stacks
from .reporting import say
from .watchdog_limits import explain, phase_limit

HANG_EXIT = 5  # the same as entrypoint/errors.HANG_EXIT, which the entrypoint restarts on
POLL_S = 1.0
# each rank's phase, rewritten every poll into the head's Ray log folder, where `rlrig status` reads it through the
# dashboard's log API (entrypoint/jobs/status.py PHASES_GLOB)
BOARD_PREFIX = "rlrig-phases-"
# which node hung, in the cluster's key-value store where rlrig's entrypoint keeps its own
# (entrypoint/cluster/gcs.py): the head counts it against that node (entrypoint/cluster/node_failures.py), in a
# restarted run and on a standing cluster
HANG_KEY_PREFIX = "hang/"
KV_NAMESPACE = b"rlrig"


def report_hang(hung: dict) -> None:
    import ray
    from ray.experimental import internal_kv

    if not ray.is_initialized():  # no cluster, no head to tell (and asking Ray for the job would start one)
        return
    key = f"{HANG_KEY_PREFIX}{ray.get_runtime_context().get_job_id()}".encode()
    internal_kv._internal_kv_put(key, json.dumps(hung).encode(), overwrite=True, namespace=KV_NAMESPACE)


@dataclass(frozen=True)
class Over:
    """A worker in one phase past that phase's limit."""

    label: str
    phase: str
    step: int
    elapsed: float
    limit: float
    why: str


class Limits:
    """Each phase's durations so far (the steps' timing_s/<phase>, the slowest rank's), and the limits they give."""

    def __init__(self, factor: float, floor: float, nccl_timeout: float):
        self.args, self.durations = (factor, floor, nccl_timeout), {}
        self.lock = threading.Lock()

    def record(self, metrics: dict) -> None:
        with self.lock:
            for k, v in metrics.items():
                if k.startswith("timing_s/") and k != "timing_s/step":
                    self.durations.setdefault(k[len("timing_s/") :], []).append(v)

    def of(self, phase: str) -> tuple[float, str]:
        with self.lock:
            d = list(self.durations.get(phase, []))
        return phase_limit(d, *self.args), explain(d, *self.args)


def overdue(seen: dict[str, tuple[str, int, float]], now: float, limits: Limits) -> list[Over]:
    """The workers past their phase's limit, longest in it first (that one waits for nobody: its peers, which
    went on to a collective, entered theirs later). `seen`: label -> (phase, step, when the phase was first seen)."""
    over = []
    for label, (phase, step, since) in seen.items():
        limit, why = limits.of(phase)
        if now - since > limit:
            over.append(Over(label, phase, step, now - since, limit, why))
    return sorted(over, key=lambda o: -o.elapsed)


class Watchdog:
    """`start()` once the workers exist, `record(metrics)` after each step, `stop()` before shutting down."""

    def __init__(
        self,
        cfg,
        out: Path,
        procs: list[stacks.Proc],
        reporting: list[str],
        kill: Callable[[], None],
        exit: Callable[[int], None] = os._exit,
    ):
        t = cfg.trainer
        self.limits = Limits(t.watchdog_factor, t.watchdog_min_s, cfg.actor_rollout_ref.nccl_timeout)
        self.out, self.procs, self.reporting, self.kill, self.exit = out, procs, reporting, kill, exit
        self.seen: dict[str, tuple[str, int, float]] = {}
        self.entries: dict[str, list] = {}  # each worker's phase-entry count when last polled
        self.board: Path | None = None  # where publish() writes, once started
        self.ips = {p.label: p.ip for p in procs}
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="rlrig-watchdog", daemon=True)

    def record(self, metrics: dict) -> None:
        self.limits.record(metrics)

    def start(self) -> None:
        import ray
        from ray.experimental import internal_kv

        from ..workers.phase_report import key

        job = ray.get_runtime_context().get_job_id()
        self.keys = {label: key(job, label) for label in self.reporting}
        self.kv = internal_kv
        self.board = Path(ray._private.worker._global_node.get_logs_dir_path()) / f"{BOARD_PREFIX}{job}.json"
        self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        self.thread.join()
        self.drop_board()

    def drop_board(self) -> None:
        if self.board is not None:
            self.board.unlink(missing_ok=True)

    def publish(self, now: float) -> None:
        """The board `rlrig status` shows: each training worker's phase and seconds in it ("" between calls)."""
        ranks = []
        for label in self.reporting:
            phase, step, since = self.seen.get(label, ("", 0, now))
            ranks.append(
                {"label": label, "ip": self.ips[label], "phase": phase, "step": step, "seconds": round(now - since, 1)}
            )
        tmp = self.board.with_suffix(".tmp")
        tmp.write_text(json.dumps({"written": time.time(), "ranks": ranks}) + "\n")
        os.replace(tmp, self.board)

    def observe(self, entries: dict[str, tuple], now: float) -> list[Over]:
        """Fold one poll's entries (label -> (phase, step[, entered]); phase "" between calls) into when each phase
        was first seen; the workers now past their limits. `entered` counts the worker's phase entries, so calls
        back to back in the same phase and step (the fully async mode's generations) are timed each from its own
        start, even when no poll saw the worker idle between them."""
        for label, (phase, step, *entered) in entries.items():
            if not phase:
                self.seen.pop(label, None)
            elif self.seen.get(label, ("", 0, 0.0))[:2] != (phase, step) or self.entries.get(label) != entered:
                self.seen[label] = (phase, step, now)
            self.entries[label] = entered
        return overdue(self.seen, now, self.limits)

    def _poll(self) -> dict[str, tuple[str, int]]:
        from ..workers.phase_report import NAMESPACE

        entries = {}
        for label, k in self.keys.items():
            raw = self.kv._internal_kv_get(k, namespace=NAMESPACE)
            if raw:
                e = json.loads(raw)
                entries[label] = (e["phase"], e["step"], e.get("entered", 0))
        return entries

    def _watch(self) -> None:
        while not self.halt.wait(POLL_S):
            now = time.monotonic()
            over = self.observe(self._poll(), now)
            self.publish(now)
            if over and not self.halt.is_set():
                self.hang(over)
                return

    def hang(self, over: list[Over]) -> None:
        """Stacks, the log's lines, the workers killed, the driver gone with HANG_EXIT."""
        folder = self.out / f"hang-step{over[0].step}"
        found = stacks.dump(self.procs, folder)
        # the one the others wait for: past its limit and not itself waiting in a collective
        stuck = next((o for o in over if not stacks.in_collective(found[o.label])), over[0])
        proc = {p.label: p for p in self.procs}[stuck.label]
        say(f"stack of {stuck.label} on {proc.ip} (pid {proc.pid}):")
        print(textwrap.indent(found[stuck.label].rstrip(), "    "), file=sys.stderr, flush=True)
        also = "".join(
            f"; {o.label} also in {o.phase} for {o.elapsed:.0f}s"
            + (" (waiting in a collective)" if stacks.in_collective(found[o.label]) else "")
            for o in over
            if o is not stuck
        )
        say(
            f"hang: {stuck.label} on node {proc.ip} did not finish {stuck.phase} at step {stuck.step}: "
            f"{stuck.elapsed:.1f}s, past its limit of {stuck.limit:.1f}s ({stuck.why}){also}; every worker's stack "
            f"in {folder}; stopping the run (exit {HANG_EXIT}; with --max-restarts it resumes from the last "
            "checkpoint)"
        )
        report_hang({"label": stuck.label, "ip": proc.ip, "phase": stuck.phase, "step": stuck.step})
        self.kill()
        self.drop_board()
        sys.stdout.flush()
        sys.stderr.flush()
        self.exit(HANG_EXIT)
