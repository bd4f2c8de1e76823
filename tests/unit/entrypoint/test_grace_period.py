"""Preemption at the entrypoint: SIGTERM or SIGUSR1 to rlrig is passed on to the command, which gets
--grace-period seconds to finish (the trainer ends its step and checkpoints) with Ray still up; then, or at once
without a grace period, everything is stopped and rlrig exits 128 + the signal."""

import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from rlrig.entrypoint import command, lifecycle
from rlrig.entrypoint.cluster.processes import STOP_SIGNALS, Stop, install_stop_handlers
from tests.helpers.entrypoint_fakes import MemoryStore

pytestmark = pytest.mark.process

# traps the signal, takes 6 s "to checkpoint" (longer than the 5 s a plain stop gives), then leaves a mark and
# exits as the trainer does
COMMAND = (
    "trap 'sleep 6; echo $1 > {mark}; exit 138' USR1; trap 'sleep 6; echo $1 > {mark}; exit 143' TERM; "
    "while true; do sleep 0.1; done"
)


@pytest.fixture
def stop_handlers():
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    install_stop_handlers()
    yield
    for s, h in before.items():
        signal.signal(s, h)


@pytest.mark.parametrize(
    "sig, grace, finished",
    [
        (signal.SIGUSR1, 30, True),
        (signal.SIGTERM, 30, True),
        (signal.SIGUSR1, 0, False),  # no grace: stopped as before, the command's own handler cut short
    ],
)
def test_a_stop_signal_is_passed_on_and_waited_for(stop_handlers, tmp_path, sig, grace, finished):
    mark = tmp_path / "checkpointed"
    ray_stand_in = subprocess.Popen(["sleep", "60"])
    threading.Timer(1.5, os.kill, (os.getpid(), sig)).start()
    started = time.monotonic()
    try:
        with pytest.raises(Stop) as e:
            command.run_command(
                ["bash", "-c", COMMAND.format(mark=mark), "cmd", "done"],
                dict(os.environ),
                MemoryStore(),
                ray_stand_in,
                grace,
            )
        assert e.value.code == 128 + sig
        assert mark.exists() is finished
        if finished:
            assert time.monotonic() - started >= 7  # the command's 6 s, after the signal at 1.5 s
        assert ray_stand_in.poll() is None  # Ray is stopped by the caller afterwards, not before the command
    finally:
        ray_stand_in.kill()


def test_grace_period_is_an_option_of_run_and_train():
    r = subprocess.run([sys.executable, "-m", "rlrig.entrypoint.cli", "run", "--help"], capture_output=True, text=True)
    assert "--grace-period" in r.stdout and "SIGUSR1" in r.stdout


@pytest.mark.parametrize("head_exits_after, waited", [(1.0, True), (None, False)])
def test_a_worker_keeps_ray_up_until_the_head_is_done_or_the_grace_is_over(head_exits_after, waited):
    from rlrig.entrypoint.cluster import coordination
    from rlrig.entrypoint.detect.nodespec import NodeSpec
    from rlrig.entrypoint.plan import Plan

    store = MemoryStore()
    plan = Plan(NodeSpec("dstack", 1, 2, "10.0.0.1", head_address="10.0.0.1"), ["true"], {}, grace_period=3)
    if head_exits_after:
        threading.Timer(head_exits_after, store.put, (coordination.EXIT, 143)).start()
    started = time.monotonic()
    stop = Stop(signal.SIGTERM)
    if waited:
        lifecycle.wait_out_the_head(plan, store, stop, lambda: None)
        assert time.monotonic() - started < 3
    else:
        with pytest.raises(Stop):
            lifecycle.wait_out_the_head(plan, store, stop, lambda: None)
        assert time.monotonic() - started >= 3


@pytest.mark.parametrize("grace, finished, code", [(30, True, 143), (0, False, 143)])
def test_on_a_ray_rlrig_did_not_start_the_signal_reaches_the_command(tmp_path, grace, finished, code):
    """`rlrig run` inside a Ray job (RAY_ADDRESS set; a standing cluster's job, a KubeRay pod) starts no Ray and runs
    the command in a session of its own: a SIGTERM to rlrig is passed on with the grace period, and no command is
    left running after rlrig exits."""
    mark = tmp_path / "checkpointed"
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "run", "--grace-period", str(grace), "--"]
        + ["bash", "-c", COMMAND.format(mark=mark), "cmd", "done"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = ""
    for line in p.stdout:  # the command runs once rlrig says it starts nothing
        seen += line
        if "starting nothing" in line:
            break
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == code, seen + out
    assert mark.exists() is finished, seen + out
    assert not [q for q in psutil.process_iter(["cmdline"]) if str(mark) in " ".join(q.info["cmdline"] or [])]
