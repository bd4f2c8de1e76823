"""`rlrig submit`: Ray's job submission to a standing cluster, with the cluster token.

Waits (up to --timeout) for the job API to answer and for every node the cluster was started with
(their `rlrig.io/nnodes` label), so a script can run `rlrig up` and `rlrig submit` without sleeps;
then submits, follows the job's output, and exits with its result.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ..cluster.coordination import NNODES_LABEL, RANK_LABEL
from ..console import say
from ..errors import NodeLost, RigError, Unreachable
from .api import DEFAULT_URL, TERMINAL, Job, JobApi
from .standing import LOST_PREFIX

STOPPED_EXIT = 4
HOW_TO_REACH = (
    "start it with `rlrig up` on every node, or reach its port: on the head, through "
    "`ssh -L 8265:localhost:8265 HEAD`, or dstack's forwarded localhost:8265 while `dstack apply` is attached"
)


def address(given: str | None, env: Mapping[str, str]) -> str:
    """--address, else Ray's RAY_API_SERVER_ADDRESS, else an http(s) RAY_ADDRESS, else loopback."""
    for value in (given, env.get("RAY_API_SERVER_ADDRESS"), env.get("RAY_ADDRESS")):
        value = (value or "").strip()
        if value.startswith(("http://", "https://")):
            return value.rstrip("/")
        if value and value is given:
            raise RigError(f"--address {value}: give the job API's URL, e.g. {DEFAULT_URL}")
    return DEFAULT_URL


def runtime_env(file: str | None, json_text: str | None, working_dir: str | None) -> dict:
    """--runtime-env FILE (YAML) or --runtime-env-json, then --working-dir over either's working_dir."""
    env: dict = {}
    if file:
        import yaml

        try:
            env = yaml.safe_load(Path(file).read_text()) or {}
        except OSError as e:
            raise RigError(f"--runtime-env {file} cannot be read ({e.strerror}); give a YAML file") from None
        except yaml.YAMLError as e:
            raise RigError(f"--runtime-env {file} is not valid YAML ({str(e).splitlines()[0]})") from None
        source = f"--runtime-env {file}"
    elif json_text:
        try:
            env = json.loads(json_text)
        except json.JSONDecodeError as e:
            raise RigError(f"--runtime-env-json is not valid JSON ({e.msg} at character {e.pos})") from None
        source = "--runtime-env-json"
    if env and not isinstance(env, dict):
        raise RigError(f"{source} must be a mapping (working_dir, env_vars, pip, ...), not {type(env).__name__}")
    if working_dir:
        if not Path(working_dir).is_dir():
            raise RigError(f"--working-dir {working_dir} is not a directory here; give a local directory to upload")
        env["working_dir"] = working_dir
    return env


def entrypoint(cmd: list[str]) -> str:
    if not cmd:
        raise RigError("no command given; usage: rlrig submit [options] -- CMD [ARGS...]")
    return shlex.join(cmd)  # as `ray job submit` joins its arguments


def exit_code(job: Job) -> int:
    """0 succeeded; 3 failed because a node was lost; the job's own code (else 1) when it failed; 4 stopped."""
    if job.status == "SUCCEEDED":
        return 0
    if job.status == "STOPPED":
        return STOPPED_EXIT
    if job.message.startswith(LOST_PREFIX):
        return 3
    code = job.driver_exit_code
    return code if code is not None and 0 < code < 256 else 1


def readiness(nodes: list[dict]) -> tuple[int, int]:
    """(rlrig nodes alive, nodes to wait for); (0, 0) for a cluster rlrig did not start.

    The nodes to wait for: those the cluster was started with, less the ranks that joined and left (a node lost or
    drained by the head: standing.py), which a job does not wait for (the trainer checks its own node count). A
    dashboard that has just started lists no node at all, not even its own head: not ready yet."""
    if not any(n.get("state") == "ALIVE" for n in nodes):
        return 0, 1
    rlrig = [n for n in nodes if RANK_LABEL in (n.get("labels") or {})]
    alive = {n["labels"][RANK_LABEL] for n in rlrig if n.get("state") == "ALIVE"}
    gone = {n["labels"][RANK_LABEL] for n in rlrig if n.get("state") != "ALIVE"} - alive
    want = max((int(n["labels"].get(NNODES_LABEL, 0)) for n in rlrig if n.get("state") == "ALIVE"), default=0)
    return len(alive), max(want - len(gone), 0) if want else 0


def wait_ready(url: str, token: str, timeout: float) -> JobApi:
    deadline = time.monotonic() + timeout
    said = ""
    while True:
        try:
            api = JobApi(url, token)
            have, want = readiness(api.nodes())
            if have >= want:
                return api
            why = f"{have}/{want} nodes"
        except Unreachable:
            why = "no answer"
        if time.monotonic() > deadline:
            raise RigError(f"the cluster at {url} was not ready within {timeout:.0f}s ({why}); {HOW_TO_REACH}")
        if why != said:
            say(f"waiting for the cluster at {url} ({why})")
            said = why
        time.sleep(0.5)


def summary(job: Job) -> str:
    first = job.message.strip().splitlines()[0] if job.message.strip() else ""
    return f"job {job.submission_id} {job.status.lower()}" + (f": {first}" if first else "")


def run(
    url: str, token: str, cmd: list[str], env: dict, submission_id: str | None, no_wait: bool, timeout: float
) -> int:
    line = entrypoint(cmd)
    api = wait_ready(url, token, timeout)
    sid = api.submit(line, env, submission_id)
    say(f"submitted job {sid} to {url}: {line}")
    if no_wait:
        print(sid, flush=True)
        say(f"follow it with: rlrig status, or ray job logs --follow {sid} / ray job stop {sid}")
        return 0
    try:
        api.follow(sid, lambda chunk: (sys.stdout.write(chunk), sys.stdout.flush()))
        job = api.job(sid)
        while job.status not in TERMINAL:  # the log stream can end a moment before the status does
            time.sleep(0.2)
            job = api.job(sid)
    except Unreachable:
        raise NodeLost(f"lost the cluster at {url} while following job {sid}; check it with rlrig status") from None
    except KeyboardInterrupt:
        say(f"stopped following; job {sid} keeps running (ray job stop {sid} stops it)")
        return 130
    say(summary(job))
    return exit_code(job)
