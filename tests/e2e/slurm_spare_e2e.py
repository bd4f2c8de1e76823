"""slurm/rlrig-baremetal.sbatch with a spare node on the real Slurm of the integration tests, grown to three nodes: a
node that hangs twice is named in the exclude file and the step goes on without it. About three minutes; outside CI.
Needs root. Run it from the repository root as
    .venv/bin/python -m tests.e2e.slurm_spare_e2e
(pytest on this one file; its default collection, and so CI, leaves it out: the name does not start with test_)."""

import sys
from pathlib import Path

import pytest

from tests.helpers.crashlog import excerpt
from tests.integration.conftest import slurm_three as slurm_three  # the three-node Slurm fixture, used by name
from tests.integration.test_slurm import REPO, TINY


def test_a_node_that_hangs_twice_is_left_out_and_a_spare_takes_its_place(slurm_three, tmp_path):
    """slurm/rlrig-baremetal.sbatch as a user submits it (rlrig from a venv, a token made by the script) on three
    nodes, one of them spare (RLRIG_SPARE_NODES=1): rank 1 hangs at steps 3 and 4; the first hang restarts in place
    (--max-restarts 1, after the recipe's own overrides), the second ends the step naming its node in the exclude
    file, and the recipe launches the step again on the other two nodes, which resumes from the last checkpoint and
    finishes with every step logged once."""
    import json

    s = slurm_three
    out, run = tmp_path / "job.out", tmp_path / "run"
    env = {
        "RLRIG_VENV": str(Path(sys.executable).parent.parent),
        "HOME": str(Path.home()),
        "RLRIG_SPARE_NODES": "1",
        "RLRIG_FAULT_HANG": "1:gen:3,1:gen:4",
    }
    r = s.run(
        "sbatch",
        "--wait",
        "--nodes=3",
        f"--output={out}",
        f"--chdir={tmp_path}",
        str(REPO / "slurm/rlrig-baremetal.sbatch"),
        *TINY[:-2],
        "--max-restarts",
        "1",
        "trainer.save_freq=2",
        "trainer.test_freq=0",
        "trainer.total_training_steps=4",
        "trainer.watchdog_min_s=10",
        "actor_rollout_ref.nccl_timeout=60",
        f"trainer.default_local_dir={run}",
        env=env,
        timeout=900,
    )
    text = out.read_text()
    assert r.returncode == 0, excerpt(text, 6000) + r.stderr
    bad = s.names[1]  # the second node of the first step hosts training rank 1
    assert "2 node(s), 1 spare" in text and "head of 2 node(s)" in text and "(slurm)" in text, text[-3000:]
    assert f"workers on {s.ns.ip(0)}, {s.ns.ip(1)}" in text, text[-3000:]  # the first step
    assert "restart 1/1: the command stopped on a hang" in text, excerpt(text, 4000)
    assert "failed twice in this run (rank 1 hung in gen at step 3; rank 1 hung in gen at step 4)" in text, text[-4000:]
    assert f"named {bad} in {tmp_path / 'rlrig-'}" in text, text[-4000:]
    assert f"leaving out {bad} (failed twice); launching the step again on a spare node (0 spare left)" in text
    assert (tmp_path / next(p.name for p in tmp_path.glob("rlrig-*.exclude"))).read_text() == f"{bad}\n"
    # the last step ran on the first and the spare node
    assert f"workers on {s.ns.ip(0)}, {s.ns.ip(2)}" in text, text[-3000:]
    steps = [json.loads(line)["training/global_step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4], text[-3000:]
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "4"


if __name__ == "__main__":  # python -m tests.e2e.NAME [pytest options]: pytest on this file
    sys.exit(pytest.main(["-q", __file__, *sys.argv[1:]]))
