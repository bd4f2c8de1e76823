"""`rlrig down`: ask a standing cluster's head to stop, through the job API alone.

The job API is the one door that reaches the head from wherever `rlrig submit` works (loopback, an SSH
tunnel, dstack's forwarded port), so `down` submits a tiny job; that job, running beside the head with
RAY_ADDRESS and the token that Ray's job supervisor gives every job, sets the head's `down` key, which
`rlrig up` polls. Then it waits until the job API stops answering.
"""

from __future__ import annotations

import os
import time

from ..cluster import coordination
from ..console import say
from ..errors import RigError, Unreachable
from .api import JobApi

IN_JOB = "rlrig down --in-job"


def request(url: str, token: str, timeout: float) -> int:
    try:
        api = JobApi(url, token)
    except Unreachable:
        raise RigError(f"no cluster answers at {url}; nothing to stop (or reach it as rlrig submit does)") from None
    sid = api.submit(IN_JOB, submission_id=f"rlrig-down-{int(time.time() * 1000)}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            job = api.job(sid)
        except Unreachable:
            say(f"the cluster at {url} is down")
            return 0
        if job.status in ("FAILED", "STOPPED"):
            first = job.message.strip().splitlines()[-1] if job.message.strip() else job.status
            raise RigError(f"the cluster at {url} did not accept rlrig down: {first}")
        time.sleep(0.5)
    raise RigError(f"the cluster at {url} still answers {timeout:.0f}s after rlrig down; look at the head's log")


def in_job(env=os.environ) -> int:
    """Runs as the job `request` submits, on the head."""
    from ..cluster.gcs import GcsStore

    address = env.get("RAY_ADDRESS", "")
    if not address:
        raise RigError(
            "rlrig down --in-job runs as a Ray job (it needs the RAY_ADDRESS Ray gives jobs); use rlrig down"
        )
    store = GcsStore.open(address)
    if store.get(coordination.MODE) != coordination.STANDING:
        raise RigError(
            f"the cluster at {address} was not started by rlrig up; it stops when its command ends or with SIGTERM"
        )
    store.put(coordination.DOWN, True)
    print(f"asked the head at {address} to stop", flush=True)
    return 0
