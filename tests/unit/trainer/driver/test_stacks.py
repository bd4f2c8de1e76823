"""Reading a live process's Python stack as the watchdog does on a worker's node: with py-spy, and with the
worker's own faulthandler dump where py-spy is missing or may not read the process."""

import subprocess
import sys

import pytest

from rlrig.trainer.driver import stacks

pytestmark = pytest.mark.process

CHILD = """
import time
from rlrig.trainer.workers.phase_report import install_stack_dump
install_stack_dump()

def waiting_here():
    print("ready", flush=True)
    time.sleep(120)

waiting_here()
"""


@pytest.fixture
def child(monkeypatch, tmp_path):
    # as on a node of rlrig's cluster: the worker and the task that reads its stack share RAY_TMPDIR
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    yield p
    p.kill()
    p.wait()


@pytest.mark.parametrize(
    "tool, first_line",
    [
        ("installed", "py-spy dump:"),
        (None, "faulthandler (py-spy is not installed):"),
        ("/bin/false", "faulthandler (py-spy failed: exit 1):"),  # e.g. no ptrace in a container
    ],
)
def test_a_live_process_stack(monkeypatch, tmp_path, child, tool, first_line):
    if tool == "installed":
        if stacks.py_spy() is None:
            pytest.fail("py-spy is not installed beside this Python (ray[default] installs it)")
    else:
        monkeypatch.setattr(stacks, "py_spy", lambda: tool)
    text = stacks.python_stack(child.pid)
    assert text.splitlines()[0] == first_line, text
    assert "waiting_here" in text, text
    # the process goes on: a dump is no kill
    assert child.poll() is None
    # its dump file is in the job's own temp dir, not loose in /tmp
    assert (tmp_path / f"rlrig-stack-{child.pid}.txt").exists()


def test_a_process_without_the_dump_handler_says_so(monkeypatch, tmp_path):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.setattr(stacks, "py_spy", lambda: None)
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert stacks.python_stack(p.pid).startswith("no stack: py-spy is not installed, and the process has no")
    finally:
        p.kill()


@pytest.mark.parametrize(
    "frame, waiting",
    [
        ("all_reduce (torch/distributed/distributed_c10d.py:2960)", True),
        ("DistributedDataParallel._pre_forward (torch/nn/parallel/distributed.py:1782)", True),
        ('File "/x/torch/autograd/graph.py", line 841 in _engine_run_backward', True),
        ("compute_score (my_reward.py:7)", False),
        ("hang_forever (trainer/workers/phase_report.py:64)", False),
    ],
)
def test_waiting_in_a_collective(frame, waiting):
    assert stacks.in_collective(f'Thread 1 (idle): "MainThread"\n    {frame}\n') is waiting
