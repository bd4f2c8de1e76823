"""process_exit.end_resource_tracker: what the children of a process left for its resource tracker is unlinked
before the process goes on to its end (a Ray worker's end kills the tracker, and vLLM leaves its worker processes'
message queues to it)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

SCRIPT = """
import multiprocessing as mp, os, sys
from multiprocessing import shared_memory

def leave_one(q):
    shm = shared_memory.SharedMemory(create=True, size=1 << 20)  # registered with the tracker the parent handed down
    q.put(shm.name)
    q.close()
    q.join_thread()
    os._exit(0)  # no unlink, as a vLLM worker process ends

if __name__ == "__main__":
    from rlrig.trainer.process_exit import end_resource_tracker

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=leave_one, args=(q,))
    p.start()
    name = q.get(timeout=30)
    p.join()
    before = os.path.exists(f"/dev/shm/{name}")
    end_resource_tracker(10)
    print(before, os.path.exists(f"/dev/shm/{name}"))
    sys.stdout.flush()
    os._exit(0)  # as a killed process: nothing of the interpreter's own exit runs
"""


def test_the_trackers_segments_are_unlinked_before_the_process_goes_on(tmp_path):
    script = tmp_path / "leaves_one.py"  # a file: spawn's child imports the target from it
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False"], (r.stdout, r.stderr)
    assert "leaked shared_memory" in r.stderr  # the tracker's own word on what it unlinked
