"""The bundled trainer for real: one node end to end, resume, export, plot; and two nodes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import shared_ray
from tests.helpers.cluster import dstack_env
from tests.helpers.crashlog import excerpt

pytestmark = pytest.mark.integration
TINY = [
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "trainer.val_before_train=False",
    "trainer.test_freq=2",
    "trainer.save_freq=2",
]


def rlrig(*args, timeout=600, own_cluster=False, **kw):
    """`rlrig ARGS`, its output captured. A `train` joins this test process's shared cluster (tests/helpers/
    shared_ray.py) unless `own_cluster`: for a test of the cluster the run forms, or whose workers need the
    environment it is given."""
    if args[0] == "train" and not own_cluster:
        kw["env"] = shared_ray.env(kw.get("env"))
    return subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", *args], capture_output=True, text=True, timeout=timeout, **kw
    )


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# verl's data.sampler.class_path/class_name, a curriculum sampler: an epoch of two batches, so the epochs show the
# driver drew from it, and each step's batch handed to its update, written down beside it; its count of updates is
# its state, which a checkpoint keeps
SAMPLER = """
import json
from pathlib import Path

import torch.utils.data


class TwoBatches(torch.utils.data.Sampler):
    def __init__(self, data_source, data_config):
        self.k, self.updates = 2 * data_config.train_batch_size, 0

    def __iter__(self):
        return iter(range(self.k - 1, -1, -1))

    def __len__(self):
        return self.k

    def update(self, batch):
        self.updates += 1
        nt = batch.non_tensor_batch
        seen = {"updates": self.updates, "samples": len(batch), "prompts": len(set(nt["uid"]))}
        seen["keys"] = sorted(batch.batch)
        seen["scored"] = float(batch.batch["token_level_scores"].sum(-1).mean())
        seen["sources"] = sorted(set(nt["data_source"]))
        with open(Path(__file__).with_name("updates.jsonl"), "a") as f:
            f.write(json.dumps(seen) + "\\n")

    def state_dict(self):
        return {"updates": self.updates}

    def load_state_dict(self, state):
        self.updates = state["updates"]
"""


def test_train_resume_export_plot(tmp_path):
    run = tmp_path / "run"
    (tmp_path / "sampler.py").write_text(SAMPLER)
    own = [f"data.sampler.class_path={tmp_path / 'sampler.py'}", "data.sampler.class_name=TwoBatches"]
    r = rlrig("train", *TINY, *own, "trainer.total_training_steps=4", f"trainer.default_local_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metrics(run)
    assert [m["training/global_step"] for m in rows] == [1, 2, 3, 4]
    assert [m["training/epoch"] for m in rows] == [0, 0, 1, 1]
    for key in (
        "critic/score/mean",
        "timing_s/step",
        "perf/throughput",
        "actor/pg_loss",
        "actor/kl_loss",
        "response_length/mean",
        "val-core/rlrig/arithmetic/reward/mean@1",
        "timing_s/gen",
        "timing_s/ref",
        "timing_s/update_actor",
        "timing_s/update_weights",
    ):
        assert key in rows[-1], key
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "4"
    # a stopped run resumes at the next step and appends to the same metrics
    r = rlrig("train", *TINY, *own, "trainer.total_training_steps=6", f"trainer.default_local_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stderr
    assert [m["training/global_step"] for m in metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert [m["training/epoch"] for m in metrics(run)][4:] == [2, 2]
    updates = [json.loads(line) for line in (tmp_path / "updates.jsonl").read_text().splitlines()]
    assert [u["updates"] for u in updates] == [1, 2, 3, 4, 5, 6]  # its state restored with the step's
    n = updates[0]["samples"] // 8
    assert all(u["prompts"] == 8 and u["samples"] == 8 * n and u["sources"] == ["rlrig/arithmetic"] for u in updates)
    want = {"advantages", "token_level_scores", "token_level_rewards", "old_log_probs", "ref_log_prob", "responses"}
    assert want <= set(updates[0]["keys"]), updates[0]["keys"]
    scores = [m["critic/score/mean"] for m in metrics(run)]
    assert [u["scored"] for u in updates] == pytest.approx(scores)  # the batch the step trained on
    r = rlrig("export", str(run), "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").num_parameters() > 0
    assert list((tmp_path / "hf").glob("*.safetensors"))
    r = rlrig("plot", str(run))
    assert r.returncode == 0 and (run / "metrics.png").stat().st_size > 1000


def test_bad_data_file_is_one_line(tmp_path):
    r = rlrig("train", "--print-config", "data.train_batch_sise=3")
    assert r.returncode == 2 and "did you mean data.train_batch_size" in r.stderr


# long: CI keeps two-node training to the end (test_recovery) and stop-and-resume (the SIGTERM test below)
@pytest.mark.long
def test_two_nodes_train_stop_and_resume(cluster_hosts, tmp_path):
    ns = cluster_hosts(2)
    run = tmp_path / "run2"

    def train_on_both(tag, *extra):
        args = [
            "train",
            *TINY,
            "trainer.nnodes=2",
            "trainer.n_gpus_per_node=1",
            f"trainer.default_local_dir={run}",
            *extra,
        ]
        nodes = [
            cluster_hosts.start(ns, i, {**dstack_env(ns, i, tag), "HOME": str(Path.home())}, args) for i in range(2)
        ]
        codes = [n.wait(600) for n in nodes]
        assert codes == [0, 0], excerpt(nodes[0].output, 4000)
        assert f"workers on {ns.ip(0)}, {ns.ip(1)}" in nodes[0].output, nodes[0].output[-3000:]
        return nodes[0].output

    train_on_both("tr2", "trainer.total_training_steps=3")
    assert [m["training/global_step"] for m in metrics(run)] == [1, 2, 3]
    # a second job on the same two nodes picks up the step-3 checkpoint, this time sharded with FSDP
    out = train_on_both("tr2b", "trainer.total_training_steps=5", "actor_rollout_ref.actor.strategy=fsdp")
    assert "resumed from" in out and "at step 3" in out, out[-3000:]
    assert [m["training/global_step"] for m in metrics(run)] == [1, 2, 3, 4, 5]
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "5"


def test_val_only_with_several_samples_and_logged_generations(tmp_path):
    """trainer.val_only validates and stops; rollout.val_kwargs.n samples per prompt give verl's mean@n, std@n and
    best@n; trainer.log_val_generations keeps that many samples."""
    run = tmp_path / "val"
    r = rlrig(
        "train",
        "trainer.val_only=True",
        "trainer.log_val_generations=3",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"trainer.default_local_dir={run}",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    [row] = metrics(run)
    assert row["training/global_step"] == 0
    src = "rlrig/arithmetic"
    assert {
        f"val-core/{src}/reward/mean@2",
        f"val-aux/{src}/reward/std@2",
        f"val-core/{src}/reward/best@2/mean",
        f"val-aux/{src}/reward/worst@2/mean",
    } <= set(row)
    assert (
        row[f"val-aux/{src}/reward/worst@2/mean"]
        <= row[f"val-core/{src}/reward/mean@2"]
        <= row[f"val-core/{src}/reward/best@2/mean"]
    )
    shown = (run / "val_generations.jsonl").read_text().splitlines()
    assert len(shown) == 3 and "validation sample" in r.stderr
    assert not list(run.glob("global_step_*"))  # nothing trained, nothing saved


# long: the rollout pool's one-step and fully async tests stop by SIGTERM and resume through the same driver
@pytest.mark.long
@pytest.mark.parametrize("sig", ["SIGTERM"])
def test_a_stop_signal_checkpoints_the_step_in_flight_and_a_relaunch_continues(tmp_path, sig):
    """Preemption: SIGTERM (a pod's, docker stop) to `rlrig train` mid-run -> passed on to the trainer, which
    finishes its step within --grace-period, writes a checkpoint there (no periodic one is due) and every process
    exits 128 + the signal; the relaunch resumes at the next step, and the metrics hold every step once. SIGUSR1
    (Slurm's warning) takes the same path; tests/e2e/slurm_requeue_e2e.py runs it on Slurm, outside CI."""
    import signal
    import time

    sig = getattr(signal, sig)
    run = tmp_path / "pre"
    args = [
        sys.executable,
        "-m",
        "rlrig.entrypoint.cli",
        "train",
        "--grace-period",
        "60",
        *TINY,
        "trainer.save_freq=0",
        "trainer.test_freq=0",
        "trainer.total_training_steps=40",
        f"trainer.default_local_dir={run}",
    ]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= 3):
        time.sleep(0.2)
    p.send_signal(sig)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, out[-3000:]
    assert "passed to the command" in out, out[-3000:]
    stopped = int((run / "latest_checkpointed_iteration.txt").read_text())
    assert stopped >= 3 and f"a relaunch resumes at step {stopped + 1}" in out, out[-3000:]
    assert [m["training/global_step"] for m in metrics(run)] == list(range(1, stopped + 1))
    r = rlrig(
        "train",
        *TINY,
        "trainer.save_freq=0",
        "trainer.test_freq=0",
        f"trainer.total_training_steps={stopped + 2}",
        f"trainer.default_local_dir={run}",
    )
    assert r.returncode == 0 and f"at step {stopped}" in r.stderr, r.stderr[-3000:]
    assert [m["training/global_step"] for m in metrics(run)] == list(range(1, stopped + 3))
