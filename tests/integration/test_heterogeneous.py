"""Heterogeneous nodes for real: three namespace nodes started with different RLRIG_RESOURCES (the OpenRLHF FAQ's
layout), the actor's workers placed on the nodes with its resource and the reference's and reward model's own
pools on the node with theirs (read back through Ray's state API); GRPO scored by a reward model; placements that
cannot be met refused in one line, before or while placing, never waited on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cluster import dstack_env

pytestmark = pytest.mark.integration
PROBE = str(Path(__file__).with_name("placement_probe.py"))
GRPO = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=2",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "data.max_response_length=8",
    "trainer.resume_mode=disable",
]
# the FAQ: actor (and critic) on the large-memory machines, reference and reward model on the small one
FAQ = [
    "actor_rollout_ref.placement.resource=h100",
    "reward_model.enable=True",
    "reward_model.enable_resource_pool=True",
    "reward_model.nnodes=1",
    "reward_model.n_gpus_per_node=1",
    "reward_model.placement.resource=v100",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.ref.enable_resource_pool=True",
    "actor_rollout_ref.ref.nnodes=1",
    "actor_rollout_ref.ref.n_gpus_per_node=1",
    "actor_rollout_ref.ref.placement.resource=v100",
]
NODE_RESOURCES = ['{"h100": 1}', '{"h100": 1}', '{"v100": 2}']


def start_three(cluster_hosts, tag, args):
    ns = cluster_hosts(3)
    # placement is what these tests read: the fabric check (test_fabric.py) on three namespace nodes sharing two
    # loaded cores can measure one veth pair at half the others' bandwidth and stop the job before placing
    args = [args[0], "--no-fabric-check", *args[1:]]
    nodes = []
    for i in range(3):
        env = {**dstack_env(ns, i, tag), "HOME": str(Path.home()), "RLRIG_RESOURCES": NODE_RESOURCES[i]}
        nodes.append(cluster_hosts.start(ns, i, env, args))
    return ns, nodes


# long: CI keeps placement's refusals here and roles in pools of their own (test_rollout_pool, the critic's)
@pytest.mark.long
def test_openrlhf_faq_layout_reference_and_reward_model_in_their_own_pools(cluster_hosts, tmp_path):
    run = tmp_path / "run"
    args = [
        "run",
        "--",
        sys.executable,
        PROBE,
        *GRPO,
        *FAQ,
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={run}",
    ]
    ns, nodes = start_three(cluster_hosts, "het", args)
    codes = [n.wait(600) for n in nodes]
    out = nodes[0].output
    assert codes == [0, 0, 0], out[-4000:]
    # each node's resources reached Ray and the head's log
    assert "v100 2" in out and "h100 1" in out, out[-4000:]
    actors = [line.split()[1:] for line in out.splitlines() if line.startswith("ACTOR ")]
    workers = sorted(ip for cls, ip, res in actors if cls == "TrainingWorker")
    rms = [(ip, res) for cls, ip, res in actors if cls == "RewardModelWorker"]
    assert workers == sorted([ns.ip(0), ns.ip(1)]) and all(
        res == "h100" for cls, _, res in actors if cls == "TrainingWorker"
    ), actors
    assert rms == [(ns.ip(2), "v100")], actors
    assert [(ip, res) for cls, ip, res in actors if cls == "RefWorker"] == [(ns.ip(2), "v100")], actors
    assert "reward_model (" in out and f"on {ns.ip(2)}" in out, out[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/global_step"] for m in rows] == [0, 1, 2]  # validation before training, then two steps
    assert "val-core/rlrig/arithmetic/reward/mean@1" in rows[0]  # validation is scored by the reward model too
    assert rows[-1]["actor/kl_loss"] > 0 and rows[-1]["timing_s/ref"] > 0  # the remote reference's log-probs
    # the embedded reward model's logits, not a rule's 0/1
    scores = {rows[-1][f"critic/score/{k}"] for k in ("min", "mean", "max")}
    assert len(scores) == 3 and not scores <= {0.0, 1.0}, rows[-1]


def test_a_resource_no_node_offers_is_refused_before_placing(cluster_hosts, tmp_path):
    args = [
        "train",
        *GRPO,
        *[a.replace("=v100", "=a100") for a in FAQ],
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=1",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    ns, nodes = start_three(cluster_hosts, "het2", args)
    codes = [n.wait(300) for n in nodes]
    out = nodes[0].output
    assert codes[0] == 2 and all(c != 0 for c in codes), (codes, out[-3000:])
    line = next(x for x in out.splitlines() if "rlrig: error:" in x)
    assert "actor_rollout_ref.ref needs 1 'a100'" in line and "v100 2" in line and "h100 1" in line, line


def test_a_placement_held_elsewhere_fails_at_the_bound(tmp_path):
    """Enough of the resource exists, but another job holds it: the trainer's placement groups cannot be placed,
    and the run stops at trainer.placement_timeout_s naming what it waited for."""
    hold = tmp_path / "hold.py"
    hold.write_text(
        "import subprocess, sys, ray\n"
        "from ray.util.placement_group import placement_group\n"
        "ray.init()\n"
        "pg = placement_group([{'h100': 1}])\n"
        "ray.get(pg.ready())\n"
        "sys.exit(subprocess.run([sys.executable, '-m', 'rlrig.trainer.driver.main', *sys.argv[1:]]).returncode)\n"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlrig.entrypoint.cli",
            "run",
            "--",
            sys.executable,
            str(hold),
            *GRPO,
            "actor_rollout_ref.placement.resource=h100",
            "trainer.placement_timeout_s=5",
            "trainer.n_gpus_per_node=1",
            "trainer.total_training_steps=1",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RLRIG_RESOURCES": '{"h100": 1}'},
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert "was not ready within trainer.placement_timeout_s=5" in r.stderr and "h100" in r.stderr, r.stderr[-3000:]
