"""The bundled trainer for real: one node end to end, resume, export, plot; and two nodes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import dstack_env

pytestmark = pytest.mark.integration
TINY = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.val_before_train=False",
        "trainer.test_freq=2", "trainer.save_freq=2"]


def rlrig(*args, timeout=600, **kw):
    return subprocess.run([sys.executable, "-m", "rlrig.entrypoint.cli", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_resume_export_plot(tmp_path):
    run = tmp_path / "run"
    r = rlrig("train", *TINY, "trainer.total_training_steps=4", f"trainer.default_local_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metrics(run)
    assert [m["training/global_step"] for m in rows] == [1, 2, 3, 4]
    for key in ("critic/score/mean", "timing_s/step", "perf/throughput", "actor/pg_loss", "actor/kl_loss",
                "response_length/mean", "val-core/rlrig/arithmetic/reward/mean@1"):
        assert key in rows[-1], key
    assert (run / "latest_checkpointed_iteration.txt").read_text() == "4"
    # a stopped run resumes at the next step and appends to the same metrics
    r = rlrig("train", *TINY, "trainer.total_training_steps=6", f"trainer.default_local_dir={run}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stderr
    assert [m["training/global_step"] for m in metrics(run)] == [1, 2, 3, 4, 5, 6]
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


def test_two_nodes_train_together(cluster_hosts, tmp_path):
    ns = cluster_hosts(2)
    run = tmp_path / "run2"
    args = ["train", *TINY, "trainer.total_training_steps=3", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
            f"trainer.default_local_dir={run}"]
    nodes = [cluster_hosts.start(ns, i, {**dstack_env(ns, i, "tr2"), "HOME": str(Path.home())}, args) for i in range(2)]
    codes = [n.wait(600) for n in nodes]
    assert codes == [0, 0], nodes[0].output[-4000:]
    assert f"workers on {ns.ip(0)}, {ns.ip(1)}" in nodes[0].output, nodes[0].output[-3000:]
    assert [m["training/global_step"] for m in metrics(run)] == [1, 2, 3]
