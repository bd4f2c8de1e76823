"""One cluster per test process that the runs of tests about the trainer join, instead of each starting and stopping
a Ray of its own (about 20 CPU-seconds and 12 s a run on 2 cores).

It is `rlrig run` on this host holding a command that prints the cluster's address and token and waits for its
stdin to close: a run given `env()` finds RAY_ADDRESS set and starts no Ray, as `rlrig train` inside a submitted job
does (lifecycle.run_existing). The holder's stdin is a pipe of this process, so the cluster ends with the test
process however that ends. Tests about how a cluster forms, stops or loses a node start their own, and so do runs
whose workers need an environment of the test's: Ray's workers take the environment of the cluster, not the
driver's.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAYS = "rlrig-shared-ray "
# the command rlrig runs on the cluster it formed: it says where that cluster is, then holds it until stdin closes
HOLD = (
    "import json, os, sys; "
    f"print({SAYS!r} + json.dumps({{k: os.environ[k] for k in ('RAY_ADDRESS', 'RAY_AUTH_MODE', 'RAY_AUTH_TOKEN')}}),"
    " flush=True); sys.stdin.read()"
)
START_S = 180.0
OWN_CLUSTERS = "RLRIG_TEST_OWN_CLUSTERS"  # =1: every run starts a cluster of its own, as before this helper

_held: tuple[subprocess.Popen, dict[str, str]] | None = None


def env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (this process's environment) with the shared cluster's address and token; starts the cluster at the
    first call, and again where the last one has ended (said on stderr: a run that took the cluster down fails its
    own test)."""
    global _held
    if os.environ.get(OWN_CLUSTERS) == "1":
        return dict(os.environ if base is None else base)
    if _held is not None and _held[0].poll() is not None:
        print(f"tests: the shared cluster ended (exit {_held[0].returncode}); starting another", file=sys.stderr)
        _held = None
    if _held is None:
        _held = _start()
    return {**(os.environ if base is None else base), **_held[1]}


def _start() -> tuple[subprocess.Popen, dict[str, str]]:
    log = Path(tempfile.mkstemp(prefix="rlrig-shared-ray-", suffix=".log")[1])
    atexit.register(log.unlink, missing_ok=True)  # read while the cluster starts; its output after that is not read
    own = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE")}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlrig.entrypoint.cli", "run", "--grace-period", "0", "--"]
            + [sys.executable, "-c", HOLD],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=own,
        )
    end = time.monotonic() + START_S
    while time.monotonic() < end and proc.poll() is None:
        said = [line for line in log.read_text().splitlines() if line.startswith(SAYS)]
        if said:
            return proc, json.loads(said[0][len(SAYS) :])
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the shared cluster did not come up within {START_S:g}s: {log.read_text()[-3000:]}")
