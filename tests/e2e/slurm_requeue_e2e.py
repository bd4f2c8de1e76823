"""slurm/rlrig-baremetal.sbatch preempted and requeued on the real two-node Slurm of the integration tests.
Outside CI: Slurm holds a requeued job back for about two minutes before it starts again, so this takes about
four. Needs root. Run it from the repository root as
    .venv/bin/python -m tests.e2e.slurm_requeue_e2e
(pytest on this one file; its default collection, and so CI, leaves it out: the name does not start with test_)."""

import sys
from pathlib import Path

import pytest

from tests.integration.conftest import slurm_cluster as slurm_cluster  # the two-node Slurm fixture, used by name
from tests.integration.test_slurm import REPO, TINY


def test_baremetal_sbatch_checkpoints_on_the_warning_signal_and_requeues_itself(slurm_cluster, tmp_path):
    """The time-limit warning (#SBATCH --signal=USR1@180), sent now with `scancel --signal=USR1`: Slurm delivers it
    to every process of the step (Ray's daemons, which ignore it, included); the trainer ends its step and writes a
    checkpoint, srun exits 138, the script requeues the job, and its second start resumes and finishes the run with
    every step logged once."""
    import json
    import time

    s = slurm_cluster
    out, run = tmp_path / "job.out", tmp_path / "run"
    steps = 10
    env = {"RLRIG_VENV": str(Path(sys.executable).parent.parent), "HOME": str(Path.home())}
    args = [
        *TINY[:-1],
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run}",
    ]
    r = s.run(
        "sbatch",
        "--parsable",
        f"--output={out}",
        f"--chdir={tmp_path}",
        str(REPO / "slurm/rlrig-baremetal.sbatch"),
        *args,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip().split(";")[0]
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 400
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        assert time.monotonic() < deadline, (out.read_text() if out.exists() else "") + s.logs()
        time.sleep(0.5)
    assert s.run("scancel", "--signal=USR1", job).returncode == 0
    deadline = time.monotonic() + 600
    while s.run("squeue", "-h", "-j", job).stdout.strip():
        assert time.monotonic() < deadline, out.read_text()[-4000:] + s.logs()
        time.sleep(1)
    text = out.read_text()
    assert "checkpointed on SIGUSR1; requeueing job" in text and "start 2" in text, text[-4000:]
    assert "resumed from" in text, text[-4000:]
    steps_logged = [json.loads(line)["training/global_step"] for line in metrics.read_text().splitlines()]
    assert steps_logged == list(range(1, steps + 1)), text[-3000:]


if __name__ == "__main__":  # python -m tests.e2e.NAME [pytest options]: pytest on this file
    sys.exit(pytest.main(["-q", __file__, *sys.argv[1:]]))
