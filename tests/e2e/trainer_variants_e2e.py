"""The trainer's variants trained against each other through `rlrig train` on one node, beyond what CI runs (each
is several trainings, about 10 minutes in all on 2 cores): FSDP, hybrid sharding, padding-free and shared-prompt
steps equal to DDP's with checkpoints moving between strategies; LoRA trained sharded, resumed under DDP and
exported; the critic packed and padded, and in its own pool; Ulysses sequence parallelism equal to data
parallelism. Run it from the repository root as
    .venv/bin/python -m tests.e2e.trainer_variants_e2e
(pytest on this one file; its default collection, and so CI, leaves it out: the name does not start with test_)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.crashlog import excerpt
from tests.integration.test_train import TINY, metrics, rlrig

LORA = [
    *TINY,
    "trainer.n_gpus_per_node=2",
    "trainer.test_freq=0",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=8",
    "actor_rollout_ref.actor.optim.lr=1e-2",
]


def test_fsdp_and_packing_train_like_ddp_and_resume_either_way(tmp_path):
    """Same seeds, same data: FSDP's sharded step (and hybrid-sharded, fsdp_size=1), padding-free (packed)
    forwards and shared prompts (use_prefix_grouper, under DDP and under FSDP with gradient checkpointing) must
    equal DDP's padded step, and checkpoints (full tensors by name) must move between the strategies."""
    two = [*TINY, "trainer.n_gpus_per_node=2", "trainer.test_freq=0"]
    keys = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss")
    variants = {
        "ddp": ["actor_rollout_ref.actor.strategy=ddp"],
        "fsdp": ["actor_rollout_ref.actor.strategy=fsdp"],
        # HSDP: shard groups of one worker, replicated over the two
        "hsdp": ["actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.fsdp_config.fsdp_size=1"],
        "packed": ["actor_rollout_ref.actor.strategy=ddp", "actor_rollout_ref.model.use_remove_padding=True"],
        "grouped": ["actor_rollout_ref.actor.strategy=ddp", "actor_rollout_ref.actor.use_prefix_grouper=True"],
        "grouped_fsdp": [
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.actor.use_prefix_grouper=True",
            "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        ],
    }
    runs = {}
    for name, extra in variants.items():
        runs[name] = tmp_path / name
        r = rlrig("train", *two, "trainer.total_training_steps=2", *extra, f"trainer.default_local_dir={runs[name]}")
        assert r.returncode == 0, r.stderr[-3000:]
    ddp = metrics(runs["ddp"])
    for m in ddp:  # trainer.balance_batch (on by default): the workers traded groups to even out their tokens
        assert m["global_seqlen/balanced_max"] <= m["global_seqlen/max"]
        assert m["global_seqlen/mean"] * 2 == m["perf/total_num_tokens"]
    for other in ("fsdp", "hsdp", "packed", "grouped", "grouped_fsdp"):
        for a, b in zip(ddp, metrics(runs[other])):
            assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-4, abs=1e-6), other
    for saved, other in (("ddp", "fsdp"), ("fsdp", "ddp")):
        r = rlrig(
            "train",
            *two,
            "trainer.total_training_steps=3",
            f"actor_rollout_ref.actor.strategy={other}",
            f"trainer.default_local_dir={runs[saved]}",
        )
        assert r.returncode == 0 and "resumed from" in r.stderr, r.stderr[-3000:]
    third = [metrics(runs[s])[2] for s in ("ddp", "fsdp")]
    assert [third[0][k] for k in keys] == pytest.approx([third[1][k] for k in keys], rel=1e-4, abs=1e-6)


def test_lora_trains_sharded_resumes_under_ddp_and_exports_merged(tmp_path):
    """verl's LoRA keys through `rlrig train` on two FSDP workers: adapters trained against the actor with them
    disabled (the KL loss starts at 0 and grows); the checkpoint resumes under DDP and exports as the merged
    model plus the adapter as peft saves it. (DDP against FSDP step by step, and a run without LoRA refusing
    the checkpoint: tests/e2e/lora_e2e.py.)"""
    run = tmp_path / "run"
    r = rlrig(
        "train",
        *LORA,
        "trainer.total_training_steps=2",
        "actor_rollout_ref.actor.strategy=fsdp",
        f"trainer.default_local_dir={run}",
    )
    assert r.returncode == 0, excerpt(r.stderr)
    assert metrics(run)[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)  # adapters start at zero
    r = rlrig(
        "train",
        *LORA,
        "trainer.total_training_steps=3",
        "actor_rollout_ref.actor.strategy=ddp",
        f"trainer.default_local_dir={run}",
    )
    assert r.returncode == 0 and "resumed from" in r.stderr, excerpt(r.stderr)
    assert metrics(run)[2]["actor/kl_loss"] > 0  # the adapters moved the policy off its reference
    hf = tmp_path / "hf"
    r = rlrig("export", str(run), "--out", str(hf))
    assert r.returncode == 0, r.stderr
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    ids = torch.tensor([[3, 5, 7, 9, 11, 13]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(hf)(ids).logits
        base = AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
        plain = base(ids).logits
        adapted = PeftModel.from_pretrained(base, hf / "lora_adapter")(ids).logits
    torch.testing.assert_close(merged, adapted, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(merged, plain, atol=1e-3)


def test_ppo_with_critic_packed_equals_padded(tmp_path):
    """verl's default estimator (gae): the critic trains beside the actor, padded or padding-free
    (both models packed), to the same numbers, and its phases are timed under verl's names."""
    gae = [
        *TINY,
        "algorithm.adv_estimator=gae",
        "trainer.n_gpus_per_node=2",
        "trainer.test_freq=0",
        "trainer.total_training_steps=2",
    ]
    keys = ("critic/vf_loss", "critic/grad_norm", "critic/vf_explained_var", "actor/pg_loss", "actor/grad_norm")
    rows = {}
    for name, extra in (
        ("padded", []),
        ("packed", ["actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=True"]),
    ):
        r = rlrig("train", *gae, *extra, f"trainer.default_local_dir={tmp_path / name}")
        assert r.returncode == 0, r.stderr[-3000:]
        rows[name] = metrics(tmp_path / name)
    for a, b in zip(rows["padded"], rows["packed"]):
        assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-4, abs=1e-6)
        assert a["critic/grad_norm"] > 0 and a["timing_s/values"] > 0 and a["timing_s/update_critic"] > 0


def test_sequence_parallel_trains_as_data_parallel(tmp_path):
    """Ulysses (ulysses_sequence_parallel_size=2 for the actor, its reference and the critic): the two workers share
    their samples and each runs half of every packed sequence; with the same micro batches (one sample each) every
    loss, gradient norm and batch metric equals the run where each worker trains its own samples whole."""
    common = [
        *TINY,
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "trainer.n_gpus_per_node=2",
        "trainer.test_freq=0",
        "trainer.total_training_steps=2",
        "actor_rollout_ref.model.use_remove_padding=True",
        "critic.model.use_remove_padding=True",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "critic.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",  # recomputed layers attend over the group too
        "actor_rollout_ref.rollout.temperature=0.8",
    ]
    sp = ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2"]
    keys = (
        "actor/pg_loss",
        "actor/grad_norm",
        "actor/kl_loss",
        "actor/entropy",
        "critic/vf_loss",
        "critic/grad_norm",
        "critic/score/mean",
        "critic/advantages/mean",
        "perf/total_num_tokens",
        "response_length/mean",
    )
    rows = {}
    for name, extra in (("dp", []), ("sp", sp)):
        r = rlrig("train", *common, *extra, f"trainer.default_local_dir={tmp_path / name}")
        assert r.returncode == 0, r.stderr[-3000:]
        rows[name] = metrics(tmp_path / name)
    assert len(rows["sp"]) == 2 and rows["sp"][0]["timing_s/sp_share"] > 0
    for a, b in zip(rows["dp"], rows["sp"]):
        assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-4, abs=1e-6)


def test_critic_in_its_own_pool_trains_as_colocated_and_resumes(tmp_path):
    """PPO with GAE: three steps with the critic in the training workers equal two steps with the critic in its own
    pool, a checkpoint, and a resumed third step (the critic's weights and Adam state travel in the checkpoint).
    The trainer starts its own local Ray with 4 CPUs for the 2 training and 2 critic workers (this machine has 2
    cores, which is all `rlrig train` would offer); with its own HOME, since a local Ray leaves a token file in
    ~/.ray that later clients (rlrig submit) would pick up."""
    base = [
        "ray_kwargs.ray_init.num_cpus=4",
        "algorithm.adv_estimator=gae",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.n_gpus_per_node=2",
        "trainer.val_before_train=False",
        "trainer.save_freq=2",
    ]
    own = ["critic.enable_resource_pool=True", "critic.nnodes=1", "critic.n_gpus_per_node=2"]

    def train(run, *extra):
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(
            HOME=str(tmp_path / "home"),
            RLRIG_CACHE=os.environ.get("RLRIG_CACHE", str(Path.home() / ".cache" / "rlrig")),
        )
        r = subprocess.run(
            [sys.executable, "-m", "rlrig.trainer.driver.main", *base, *extra, f"trainer.default_local_dir={run}"],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stderr

    train(tmp_path / "a", "trainer.total_training_steps=3")
    out = train(tmp_path / "b", *own, "trainer.total_training_steps=2")
    assert "placement: actor_rollout_ref + ref on" in out and "; critic on" in out, out[-2000:]
    out = train(tmp_path / "b", *own, "trainer.total_training_steps=3")
    assert "resumed from" in out and "at step 2" in out, out[-2000:]
    last = [json.loads((tmp_path / r / "metrics.jsonl").read_text().splitlines()[-1]) for r in ("a", "b")]
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/vf_explained_var", "actor/pg_loss", "actor/grad_norm"):
        assert last[0][key] == pytest.approx(last[1][key], rel=1e-6), key
    assert last[1]["training/global_step"] == 3 and last[1]["timing_s/update_critic"] >= 0


if __name__ == "__main__":  # python -m tests.e2e.NAME [pytest options]: pytest on this file
    sys.exit(pytest.main(["-q", __file__, *sys.argv[1:]]))
