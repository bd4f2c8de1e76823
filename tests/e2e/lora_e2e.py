"""LoRA through `rlrig train` beyond tests/e2e/trainer_variants_e2e.py (which trains it under FSDP, resumes under
DDP and exports): two workers step for step equal under DDP and FSDP, and a run without LoRA refusing
the checkpoint in one line before any worker starts. Outside CI (about two and a half minutes here). Run it from
the repository root as
    .venv/bin/python -m tests.e2e.lora_e2e"""

import sys

import pytest

from tests.helpers.crashlog import excerpt
from tests.integration.test_train import LORA, TINY, metrics, rlrig


def test_lora_ddp_equals_fsdp_and_a_full_run_refuses_its_checkpoint(tmp_path):
    keys = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss")
    runs = {s: tmp_path / s for s in ("ddp", "fsdp")}
    for s, run in runs.items():
        r = rlrig(
            "train",
            *LORA,
            "trainer.total_training_steps=3",
            f"actor_rollout_ref.actor.strategy={s}",
            f"trainer.default_local_dir={run}",
        )
        assert r.returncode == 0, excerpt(r.stderr)
    assert metrics(runs["ddp"])[2]["actor/kl_loss"] > 0
    for a, b in zip(metrics(runs["ddp"]), metrics(runs["fsdp"])):
        assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-4, abs=1e-6)
    r = rlrig(
        "train",
        *TINY,
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=4",
        f"trainer.default_local_dir={runs['ddp']}",
    )
    errors = [line for line in r.stderr.splitlines() if line.startswith("rlrig: error:")]
    assert (
        r.returncode == 2
        and errors
        and "holds LoRA adapters (r=4, lora_alpha=8, 14 layers), but this run trains all weights" in errors[0]
    ), r.stderr[-2000:]
    assert "workers on" not in r.stderr  # refused before any worker started


if __name__ == "__main__":  # python -m tests.e2e.NAME [pytest options]: pytest on this file
    sys.exit(pytest.main(["-q", __file__, *sys.argv[1:]]))
