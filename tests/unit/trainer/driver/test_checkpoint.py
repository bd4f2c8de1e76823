import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from rlrig.trainer.driver import checkpoint

pytestmark = pytest.mark.process


def test_save_and_load(tmp_path):
    checkpoint.save(str(tmp_path), 2, {"w": torch.ones(2)}, [{"r": 1}], {"global_step": 2})
    path = checkpoint.latest(str(tmp_path))
    assert path.name == "global_step_2"
    state, rng, ts = checkpoint.load(path)
    assert torch.equal(state["w"], torch.ones(2)) and ts["global_step"] == 2


WRITER = """
import sys, torch
from rlrig.trainer.driver import checkpoint
root = sys.argv[1]
checkpoint.save(root, 1, {"w": torch.zeros(10)}, [], {"global_step": 1})
print("first", flush=True)
step = 2
while True:  # large saves, killed at some point in the middle of one
    checkpoint.save(root, step, {"w": torch.full((4_000_000,), float(step))}, [], {"global_step": step})
    step += 1
"""


def test_kill_9_during_save_keeps_latest_good(tmp_path):
    for delay in (0.3, 0.9, 1.7):
        root = tmp_path / f"run{delay}"
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "first"
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        path = checkpoint.latest(str(root))
        state, _, ts = checkpoint.load(path)  # loads completely: never a torn file
        assert ts["global_step"] == int(path.name.split("_")[-1])
        if ts["global_step"] > 1:
            assert float(state["w"][0]) == ts["global_step"]
        checkpoint.clean_partial(str(root))
        assert not list(root.glob(".global_step_*"))


def test_metrics_after_the_resume_point_are_not_kept_twice(tmp_path):
    from rlrig.trainer.driver.preemption import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"training/global_step": s}) + "\n" for s in (0, 1, 2, 3, 4)))
    assert truncate_metrics(path, 2) == 2
    assert [json.loads(x)["training/global_step"] for x in path.read_text().splitlines()] == [0, 1, 2]
    assert truncate_metrics(path, 2) == 0
