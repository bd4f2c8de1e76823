"""The end of a node: every process below the entrypoint stopped, the ones that ignore SIGTERM killed."""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.process

# A stand-in for `ray start --block` in a session of its own, with a daemon that exits on SIGTERM and one that ignores
# it (as Ray's slow ones take their time), run under a subreaper as the entrypoint runs Ray.
SCRIPT = textwrap.dedent(
    """
    import json, subprocess, sys, time
    import psutil
    from rlrig.entrypoint.cluster.processes import become_subreaper, stop_ray

    assert become_subreaper()
    ignores = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(600)"
    )
    daemons = (
        f"import subprocess, sys, time; subprocess.Popen(['sleep', '600']); "
        f"p = subprocess.Popen([sys.executable, '-c', {ignores!r}], stdout=subprocess.PIPE); p.stdout.readline(); "
        "print('up', flush=True); time.sleep(600)"
    )
    ray = subprocess.Popen([sys.executable, "-c", daemons], stdout=subprocess.PIPE, start_new_session=True, text=True)
    assert ray.stdout.readline().strip() == "up"
    tree = psutil.Process().children(recursive=True)
    killed = stop_ray(ray, grace=0.5)
    left = [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    print(json.dumps({"started": len(tree), "killed": killed, "left": left}))
    """
)


def test_every_process_below_is_stopped_and_one_that_ignores_sigterm_is_killed():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["started"] == 3, out  # the stand-in, sleep, the one that ignores SIGTERM
    assert out["left"] == [], out
    assert out["killed"] == 1, out  # the one that ignores SIGTERM; the stand-in and sleep went on it


SITE = "/venv/lib/python3.11/site-packages"


@pytest.mark.parametrize(
    "cmdline, daemon",
    [
        ([f"{SITE}/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp/x"], True),
        ([f"{SITE}/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=/tmp/s"], True),
        (["/venv/bin/python3", f"{SITE}/ray/dashboard/dashboard.py", "--host=127.0.0.1"], True),
        (["/venv/bin/python3", "-u", f"{SITE}/ray/autoscaler/_private/monitor.py"], True),
        (["/venv/bin/python3", "-u", f"{SITE}/ray/_private/log_monitor.py"], True),
        (["/venv/bin/python3", "-m", "ray.util.client.server", "--port=10001"], True),
        (["ray-dashboard-NodeHead-0 (/venv/bin/python3 -B -c ...)"], True),
        (["ray::DashboardAgent"], True),
        (["ray::RuntimeEnvAgent"], True),
        (["/venv/bin/python3", "/venv/bin/ray", "start", "--block"], True),
        # the job's own: Ray's workers and whatever the command started, which may be cleaning up
        (["ray::RolloutWorker"], False),
        (["ray::TrainingWorker.step"], False),
        (["ray::IDLE"], False),
        (["/venv/bin/python", "train.py", "--dashboard"], False),
        ([], False),  # gone before it was read
    ],
)
def test_ray_daemons_are_told_from_the_jobs_processes(cmdline, daemon):
    from rlrig.entrypoint.cluster.processes import is_ray_daemon

    assert is_ray_daemon(cmdline) is daemon
