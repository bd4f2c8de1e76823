"""`srun --ntasks-per-node=1 rlrig run -- CMD` on a real two-node Slurm, as an HPC user runs it."""

import sys
from pathlib import Path

import pytest

from conftest import TOKEN

pytestmark = pytest.mark.integration
CHECK = str(Path(__file__).with_name("check_cluster.py"))
RLRIG = str(Path(sys.executable).with_name("rlrig"))


def test_srun_forms_one_cluster_and_returns_the_code(slurm_cluster):
    s = slurm_cluster
    env = {"RLRIG_CLUSTER_TOKEN": TOKEN, "RLRIG_ENV_FROM_HEAD_ENV": "reached", "EXIT_WITH": "5",
           "PYTHONUNBUFFERED": "1"}
    r = s.run("srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", RLRIG, "run", "--", sys.executable, CHECK,
              env=env, timeout=300)
    out = r.stdout + r.stderr
    assert "NODES 2" in out, out + s.logs()
    for i in range(2):
        assert f"WORKER {s.ns.ip(i)} reached eth0" in out, out
    assert "head of 2 node(s) at " in out and "(slurm)" in out, out
    assert "NO_TOKEN_DRIVER refused" in out, out
    # srun reports the highest task exit code: both nodes exited with CMD's 5
    assert r.returncode == 5, out


def test_batch_script_without_srun_is_refused(slurm_cluster, tmp_path):
    s = slurm_cluster
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -N 2\n{RLRIG} doctor\n")
    out = tmp_path / "job.out"
    r = s.run("sbatch", "--wait", f"--output={out}", str(script), env={"RLRIG_CLUSTER_TOKEN": TOKEN}, timeout=120)
    text = out.read_text()
    assert r.returncode == 2, r.stdout + r.stderr + text
    assert "srun --ntasks-per-node=1" in text, text
