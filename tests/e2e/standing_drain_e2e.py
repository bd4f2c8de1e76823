"""A standing cluster drains a node that hung twice, and the next trainer runs without it: three `rlrig up` namespace
hosts and three trainers submitted, about two and a half minutes; outside CI. Needs root. Run it from the repository
root as
    .venv/bin/python -m tests.e2e.standing_drain_e2e
(pytest on this one file; its default collection, and so CI, leaves it out: the name does not start with test_)."""

import subprocess
import sys

import pytest

from tests.helpers.crashlog import excerpt
from tests.integration.conftest import cluster_hosts as cluster_hosts  # the namespace hosts fixture, used by name
from tests.integration.test_standing import rlrig, up
from tests.integration.test_train import metrics


def test_a_node_that_hangs_twice_is_drained_and_the_next_trainer_runs_without_it(cluster_hosts, tmp_path):
    """Three nodes; two submitted trainers hang in training rank 1 (on node rank 1): the head counts both hangs
    against that node and drains it, Ray stops it, its `rlrig up` ends; a trainer sized for three nodes is then
    refused naming the two left, and one sized for two trains on ranks 0 and 2."""
    ns, nodes = up(cluster_hosts, 3, "st2")

    def train(run: str, nnodes: int, *before: str) -> subprocess.CompletedProcess:
        args = ["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=6"]  # over 3 or 2 nodes
        args += ["trainer.val_before_train=False", "trainer.test_freq=0", "trainer.save_freq=0"]
        args += [f"trainer.nnodes={nnodes}", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=2"]
        args += ["trainer.watchdog_min_s=5", "actor_rollout_ref.nccl_timeout=60", f"trainer.default_local_dir={run}"]
        return rlrig(ns, 0, "submit", "--", *before, "rlrig", "train", *args, timeout=600)

    for i in range(2):
        r = train(str(tmp_path / f"hangs{i}"), 3, "env", "RLRIG_FAULT_HANG=1:gen:2")
        assert r.returncode == 5, excerpt(r.stdout + r.stderr, 4000)
        assert "hang: rank 1 on node " + ns.ip(1) in r.stdout, r.stdout[-3000:]
    nodes[0].wait_for("drained it", 60)
    head = nodes[0].output
    twice = "failed twice (rank 1 hung in gen at step 2; rank 1 hung in gen at step 2): drained it"
    assert f"{ns.ip(1)}) {twice}" in head, head[-3000:]
    assert nodes[1].wait(60) == 3, nodes[1].output[-2000:]  # its rlrig up stopped its Ray and left
    assert "the head drained this node: rank 1 (" in nodes[1].output, nodes[1].output[-2000:]
    nodes[0].wait_for("drained node rank 1", 60)
    # the trainer uses the cluster that is there, so its size must match
    r = train(str(tmp_path / "three"), 3)
    assert r.returncode == 2, r.stdout[-2000:]  # the job's own exit code: rlrig train's for bad input
    assert "trainer.nnodes=3 but the cluster at" in r.stdout and "set trainer.nnodes=2" in r.stdout, r.stdout[-2000:]
    run = tmp_path / "two"
    r = train(str(run), 2)
    assert r.returncode == 0, excerpt(r.stdout + r.stderr, 4000)
    assert f"workers on {ns.ip(0)}, {ns.ip(2)}" in r.stdout, r.stdout[-3000:]
    assert [m["training/global_step"] for m in metrics(run)] == [1, 2]
    for i in (0, 2):
        nodes[i].proc.terminate()
    assert nodes[0].wait(60) == 143


if __name__ == "__main__":  # python -m tests.e2e.NAME [pytest options]: pytest on this file
    sys.exit(pytest.main(["-q", __file__, *sys.argv[1:]]))
