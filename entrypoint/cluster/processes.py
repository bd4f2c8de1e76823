"""Owning every process rlrig starts, so that teardown leaves nothing behind.

`ray start` spawns daemons that outlive their parent. Marking this process a child subreaper
makes those orphans our descendants, so one sweep of our process tree finds them all, without
`ray stop` (which kills every Ray process on the machine, other jobs' included).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc to load, or no prctl (not Linux): orphans go to init instead
        return False


def terminate_group(proc: subprocess.Popen, grace: float = 5.0) -> int | None:
    """SIGTERM a child's process group, SIGKILL it after `grace` seconds."""
    if proc.poll() is not None:
        return proc.returncode
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


# Ray's own daemons take their time over SIGTERM (its GCS about 2 s, the dashboard, monitors and client server about
# 3 s on an idle node, at the end of every run) though they hold nothing of the job's by then: the command has ended
# and the workers have read its code. They are known by where Ray installs them and by the titles Ray gives them.
# Anything else below us (Ray's workers, the command's leftovers) is left to end on its own first: Ray ends a finished
# job's workers through their exit handlers (a vLLM engine removing its shared memory), which a signal would cut short.
RAY_DAEMONS = (
    "/ray/core/src/ray/",  # gcs_server, raylet
    "/ray/dashboard/",
    "/ray/autoscaler/",
    "/ray/_private/log_monitor.py",
    "ray.util.client.server",
    "ray-dashboard-",
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
    "/bin/ray start",
)
DAEMON_GRACE_S = 1.0


def stop_ray(ray_proc: subprocess.Popen | None, grace: float = 5.0) -> int:
    """This node's Ray stopped, and everything else below this process: Ray's daemons asked at once; the rest (its
    workers, the command's leftovers) given up to `grace` seconds to end on their own; then whatever is left is
    swept (SIGTERM, SIGKILL a second later for Ray's daemons still stopping). How many were killed."""
    import psutil

    if ray_proc is not None and ray_proc.poll() is None:
        try:
            os.killpg(ray_proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    start, me = time.monotonic(), psutil.Process()
    while time.monotonic() < start + grace:
        procs = [p for p in me.children(recursive=True) if _running(p)]
        daemons_only = all(is_ray_daemon(_cmdline(p)) for p in procs)
        if not procs or daemons_only and time.monotonic() >= start + DAEMON_GRACE_S:
            break
        psutil.wait_procs(procs, timeout=0.1)
    left = sweep_descendants(DAEMON_GRACE_S)
    if ray_proc is not None:
        terminate_group(ray_proc, grace)
    return left


def is_ray_daemon(cmdline: list[str]) -> bool:
    """Whether a process's command line is one of Ray's own daemons (RAY_DAEMONS) rather than the job's."""
    line = " ".join(cmdline)
    return any(mark in line for mark in RAY_DAEMONS)


def sweep_descendants(grace: float = 5.0) -> int:
    """TERM then KILL everything below this process; returns how many were left to kill."""
    import psutil

    me = psutil.Process()
    procs = me.children(recursive=True)
    if not procs:
        return 0
    _signal_all(procs, "terminate")
    _, alive = psutil.wait_procs(procs, timeout=grace)
    _signal_all(alive, "kill")
    psutil.wait_procs(alive, timeout=5)
    # Orphans re-parented to us after the first listing (a raylet's workers) are reaped here.
    late = me.children(recursive=True)
    _signal_all(late, "kill")
    psutil.wait_procs(late, timeout=5)
    _reap()
    return len(alive) + len(late)


def _running(p) -> bool:
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(p) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _signal_all(procs, how: str) -> None:
    import psutil

    for p in procs:
        try:
            getattr(p, how)()
        except psutil.NoSuchProcess:
            pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Stop(Exception):
    """A signal asked us to stop; carries the exit code (128 + signal number)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.code = signum, 128 + signum


# SIGUSR1: the warning a scheduler sends before it preempts (Slurm's --signal=USR1@SECONDS), as a pod's SIGTERM is
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


def install_stop_handlers() -> None:
    def handler(signum, frame):
        for s in STOP_SIGNALS:  # ignore repeats so teardown itself is not interrupted
            signal.signal(s, signal.SIG_IGN)
        raise Stop(signum)

    for s in STOP_SIGNALS:
        signal.signal(s, handler)


def pass_on(stop: Stop, proc: subprocess.Popen, grace: float) -> None:
    """Give the command the signal that stopped us and up to `grace` seconds to finish (the trainer ends its step
    and writes a checkpoint); terminate_group ends whatever is left."""
    if grace <= 0 or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, stop.signum)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
