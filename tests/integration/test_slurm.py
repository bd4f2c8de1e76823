"""`srun --ntasks-per-node=1 rlrig run -- CMD` on a real two-node Slurm, as an HPC user runs it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cluster import TOKEN
from tests.helpers.crashlog import excerpt

# one after another (pytest-xdist's loadgroup): every Slurm here shares the host's munged and /etc/hosts
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("slurm")]
CHECK = str(Path(__file__).with_name("check_cluster.py"))
RLRIG = str(Path(sys.executable).with_name("rlrig"))


def test_srun_forms_one_cluster_and_returns_the_code(slurm_cluster):
    s = slurm_cluster
    env = {
        "RLRIG_CLUSTER_TOKEN": TOKEN,
        "RLRIG_ENV_FROM_HEAD_ENV": "reached",
        "EXIT_WITH": "5",
        "PYTHONUNBUFFERED": "1",
    }
    r = s.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        RLRIG,
        "run",
        "--",
        sys.executable,
        CHECK,
        env=env,
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert "NODES 2" in out, out + s.logs()
    for i in range(2):
        assert f"WORKER {s.ns.ip(i)} reached eth0" in out, out
    assert "head of 2 node(s) at " in out and "(slurm)" in out, out
    assert "NO_TOKEN_DRIVER refused" in out, out
    # srun reports the highest task exit code: both nodes exited with CMD's 5
    assert r.returncode == 5, out


# each job's driver counts its cluster's nodes and stays a while, so that both jobs' clusters stand side by side
BESIDE = (
    "import time, ray; ray.init(); time.sleep(2); "
    "print('NODES', len([n for n in ray.nodes() if n['Alive']]), flush=True); time.sleep(15)"
)


def test_two_jobs_on_the_same_nodes_each_form_their_own_cluster(slurm_cluster):
    """Two two-node Slurm jobs placed on the same two nodes (oversubscribed): each head derives its ports from its own
    job id, so both form, run and finish without knowing of each other."""
    s = slurm_cluster
    env = {**s.env, "RLRIG_CLUSTER_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}  # one token: only the ports part them
    env.pop("RLRIG_RAY_PORT", None)
    line = ["srun", "-N2", "--ntasks-per-node=1", "--oversubscribe", "--kill-on-bad-exit=1"]
    jobs = [
        subprocess.Popen(
            [*line, RLRIG, "run", "--no-fabric-check", "--", sys.executable, "-c", BESIDE],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        # past rlrig's own --timeout (300 s), which bounds a loaded node's tries to join
        outs = [j.communicate(timeout=420)[0] for j in jobs]
    except subprocess.TimeoutExpired:
        for j in jobs:
            j.kill()
        said = "\n----\n".join(excerpt(j.communicate()[0] or "", 4000) for j in jobs)  # each job's output to the kill
        pytest.fail(f"the two jobs did not both end within 420 s:\n{said}\n{s.logs()}")
    finally:
        for j in jobs:
            j.kill()
    for j, out in zip(jobs, outs):
        assert j.returncode == 0, excerpt(out, 4000) + s.logs()
        assert "NODES 2" in out, out
    heads = [re.search(r"head of 2 node\(s\) at (\S+) \(slurm\)", out) for out in outs]
    assert all(heads), outs
    assert heads[0].group(1) != heads[1].group(1), outs  # one node, two heads, two ports
    started = [re.search(r"rlrig: 2 node\(s\) alive after", out) for out in outs]
    assert all(started), outs


def test_batch_script_without_srun_is_refused(slurm_cluster, tmp_path):
    s = slurm_cluster
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -N 2\n{RLRIG} run -- true\n")
    out = tmp_path / "job.out"
    r = s.run("sbatch", "--wait", f"--output={out}", str(script), env={"RLRIG_CLUSTER_TOKEN": TOKEN}, timeout=120)
    text = out.read_text()
    assert r.returncode == 2, r.stdout + r.stderr + text
    assert "srun --ntasks-per-node=1" in text, text


REPO = Path(__file__).resolve().parents[2]
TINY = [
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "trainer.val_before_train=False",
    "trainer.test_freq=2",
    "trainer.save_freq=2",
    "trainer.total_training_steps=2",
]


# long: CI keeps srun forming one cluster and returning the code, and the standing cluster's jobs (test_standing)
@pytest.mark.long
def test_standing_cluster_sbatch_recipe_submits_training_to_both_nodes(slurm_cluster, tmp_path):
    """slurm/rlrig-cluster.sbatch as the README gives it: `rlrig up` on both nodes of the allocation, the job
    submitted from the batch script on the head, then `rlrig down`; the job's result is the script's."""
    s = slurm_cluster
    out, run = tmp_path / "job.out", tmp_path / "run"
    env = {"RLRIG_VENV": str(Path(sys.executable).parent.parent), "HOME": str(Path.home())}
    r = s.run(
        "sbatch",
        "--wait",
        f"--output={out}",
        f"--chdir={tmp_path}",
        str(REPO / "slurm/rlrig-cluster.sbatch"),
        "rlrig",
        "train",
        *TINY,
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        f"trainer.default_local_dir={run}",
        env=env,
        timeout=600,
    )
    text = out.read_text()
    assert r.returncode == 0, excerpt(text, 4000) + r.stderr
    assert f"workers on {s.ns.ip(0)}, {s.ns.ip(1)}" in text, text[-3000:]
    assert (run / "metrics.jsonl").read_text().count("\n") == 2


def test_apptainer_node_script_forwards_each_tasks_slurm_variables(slurm_cluster, tmp_path):
    """apptainer/rlrig-node.sh under real srun. Apptainer itself cannot run here, so APPTAINER points at a
    stand-in that prints what the container would receive; the forwarding is the script's own logic."""
    s = slurm_cluster
    shim = tmp_path / "apptainer"
    shim.write_text('#!/bin/sh\necho "ARGS $*"\nenv | grep ^APPTAINERENV_ | sort\n')
    shim.chmod(0o755)
    r = s.run(
        "srun",
        "-N2",
        "--ntasks-per-node=1",
        "--label",
        str(REPO / "apptainer/rlrig-node.sh"),
        "img.sif",
        "train",
        "x=1",
        env={"APPTAINER": str(shim), "RLRIG_CLUSTER_TOKEN": TOKEN, "RAY_TMPDIR": "/tmp/rlrig-j"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for task in (0, 1):
        mine = [line.split(": ", 1)[1] for line in lines if line.startswith(f"{task}: ")]
        assert "ARGS run --nv --cleanenv img.sif train x=1" in mine, mine
        assert f"APPTAINERENV_SLURM_NODEID={task}" in mine, mine
        assert f"APPTAINERENV_RLRIG_CLUSTER_TOKEN={TOKEN}" in mine and "APPTAINERENV_RAY_TMPDIR=/tmp/rlrig-j" in mine
        assert any(m.startswith("APPTAINERENV_SLURM_JOB_NODELIST=") for m in mine)
