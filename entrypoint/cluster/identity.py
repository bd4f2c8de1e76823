"""Whose cluster a head is: the run's identity, recorded in the head's store under `run` before anything else, and
checked by every node that reaches it, so that no node joins (and no head takes over) another run's cluster, be it
one started beside it on the same port and token by accident, or a stale one left by a killed run.

A multi-node run's id is derived from its launcher's job identity (ports.identity_key), so every node of one job
knows it without talking; a single-node run's is random (no other node ever checks it).
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import time
from collections.abc import Mapping

from ..errors import RigError

RUN = "run"  # the key of the head's store that holds its run's identity


def run_id(key: str, nnodes: int) -> str:
    if nnodes <= 1:
        return secrets.token_hex(8)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def make(launcher: str, job_id: str, key: str, nnodes: int, output: str) -> dict:
    """This run's identity, as its head records it and its nodes compare it."""
    return {
        "id": run_id(key, nnodes),
        "launcher": launcher,
        "job": job_id,
        "nnodes": nnodes,
        "output": output,
        "host": socket.gethostname(),
        "started": time.time(),
    }


def describe(run: Mapping) -> str:
    """`slurm job 12.0 (2 nodes) started 2026-11-28 18:40:02 on gpu1, output /runs/a`: whose a head is."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.get("started") or 0))
    out = f", output {run['output']}" if run.get("output") else ""
    return f"{who(run)} started {when} on {run.get('host', '?')}{out}"


def who(run: Mapping) -> str:
    """`slurm job 12.0 (2 node(s))`"""
    job = f" job {run['job']}" if run.get("job") else ""
    return f"{run.get('launcher', '?')}{job} ({run.get('nnodes', '?')} node(s))"


def same_run(theirs: Mapping, mine: Mapping) -> bool:
    return all(theirs.get(k) == mine.get(k) for k in ("id", "launcher", "nnodes"))


def claim(store, mine: Mapping, address: str) -> None:
    """The head: record this run as the store's, unless another run already has (this head reached a GCS that is
    not its own)."""
    theirs = store.get(RUN)
    if theirs is not None and theirs.get("id") != mine["id"]:
        raise RigError(
            f"the Ray GCS at {address} belongs to another run: {describe(theirs)}; this run's head did not start "
            "its own there; stop that run or give this one another port (RLRIG_RAY_PORT)"
        )
    store.put(RUN, dict(mine))


def check(store, mine: Mapping, address: str, rank: int) -> None:
    """A worker: refuse a head that recorded another run (or none: not an rlrig head of this version)."""
    theirs = store.get(RUN)
    if theirs is not None and same_run(theirs, mine):
        return
    whose = f"another run's: {describe(theirs)}" if theirs is not None else "not an rlrig run's head (no run recorded)"
    raise RigError(
        f"rank {rank} of {who(mine)} reached the Ray head at "
        f"{address}, which is {whose}; not joining it: check the head address and RLRIG_RAY_PORT, or stop that run"
    )
