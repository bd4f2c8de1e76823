"""The rlrig runs on this host, each as a small record file, so that runs can keep out of each other's ports and
`rlrig status --runs` can list them.

One JSON file per rlrig process (`<pid>.json`) in a per-user folder (RLRIG_RUNS_DIR, else /tmp/rlrig-runs-<uid>;
mode 0700): the run's identity, its node, its ports, its GPUs, its output folder and its phase. Written when the
node's ports are chosen (under the folder's lock, so two runs started together never pick one port), rewritten
as the phase changes, removed when the process ends. A record whose process is gone (killed) is stale: whoever
reads the folder removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import psutil

from ..console import table

LOCK = ".lock"
PHASES = ("starting", "waiting for nodes", "running", "stopping")


def runs_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("RLRIG_RUNS_DIR") or f"/tmp/rlrig-runs-{os.getuid()}")


def _made(directory: Path) -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def process_started(pid: int) -> float | None:
    """When `pid` started (seconds since the epoch), or None when there is no such process: with the pid, what tells
    a live record from a stale one whose pid was reused."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def is_live(record: Mapping, started: Callable[[int], float | None] = process_started) -> bool:
    pid, when = record.get("pid"), record.get("pid_started")
    now = started(pid) if isinstance(pid, int) else None
    return now is not None and (when is None or abs(now - when) < 1.0)


def read_all(directory: Path, started: Callable[[int], float | None] = process_started) -> list[dict]:
    """The live records in `directory`, oldest first; stale ones (their process is gone) are removed."""
    out = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written (never: writes are atomic) or removed meanwhile
        if is_live(record, started):
            out.append(record)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    return sorted(out, key=lambda r: r.get("started", 0))


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[list[dict]]:
    """The live records, with the folder locked against other runs choosing ports meanwhile."""
    _made(directory)
    with open(directory / LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield read_all(directory)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def taken_ports(records: list[dict]) -> set[int]:
    return {p for r in records for p in (r.get("ports") or {}).values()}


class Record:
    """This process's record: written by `write`, its phase changed by `phase`, removed by `remove` (and by
    whoever finds its process gone). Holds the whole record, so each change rewrites the file in one rename."""

    def __init__(self, directory: Path, fields: Mapping):
        self.path = directory / f"{os.getpid()}.json"
        self.fields = {"pid": os.getpid(), "pid_started": process_started(os.getpid()), **fields}

    def write(self) -> None:
        _made(self.path.parent)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.fields, f)
        os.replace(tmp, self.path)

    def phase(self, phase: str) -> None:
        self.fields["phase"] = phase
        with contextlib.suppress(OSError):  # a record is for people to read: never a reason to stop a run
            self.write()

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def reserve(directory: Path, choose: Callable[[set[int]], dict[str, int]], fields: Mapping) -> Record:
    """Choose this node's ports with `choose` (given the ports other runs here hold) and record them, under the
    folder's lock: the ports are this run's from here on, for every other rlrig run of this user on this host."""
    with locked(directory) as others:
        ports = choose(taken_ports(others))
        record = Record(directory, {**fields, "ports": ports, "phase": "starting", "started": time.time()})
        record.write()
    return record


def visible_gpus(env: Mapping[str, str]) -> str:
    """The GPUs a run was given, as its environment names them ("all" where nothing narrows them)."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if var in env:
            return env[var] or "none"
    return "all"


def render(records: list[dict], directory: Path) -> str:
    """`rlrig status --runs`: one row per rlrig process on this host."""
    if not records:
        return f"no rlrig run on this host ({directory})"
    rows = []
    for r in records:
        ports = r.get("ports") or {}
        rows.append(
            [
                str(r.get("pid", "")),
                f"{r.get('launcher', '')} {r.get('job') or '-'}",
                f"{r.get('rank', 0)}/{r.get('nnodes', 1)}",
                str(r.get("phase", "")),
                str(ports.get("gcs", "-")),
                str(ports.get("dashboard", "-")),
                str(r.get("gpus", "")),
                time.strftime("%H:%M:%S", time.localtime(r.get("started", 0))),
                str(r.get("output", "")),
            ]
        )
    header = ["pid", "run", "rank", "phase", "gcs", "dashboard", "gpus", "started", "output"]
    return "\n".join([f"{len(records)} rlrig run(s) on this host:", *table(header, rows)])
