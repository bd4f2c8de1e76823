"""On-policy distillation for real (rlrig train --preset distill, the hf engine, CPU): the student's agreement
with the teacher and its score rise; the teacher in a pool of its own (distillation.nnodes) serves the training
worker through Ray."""

from pathlib import Path

import pytest

from tests.integration.test_train import metrics, rlrig

pytestmark = pytest.mark.integration
VAL = "val-core/rlrig/arithmetic/reward/mean@1"


def distill(run: Path, *extra: str) -> list[dict]:
    r = rlrig("train", "--preset", "distill", "trainer.save_freq=-1", f"trainer.default_local_dir={run}", *extra,
              timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return metrics(run)


def test_the_teacher_in_a_pool_of_its_own_scores_the_samples(tmp_path):
    pool = ["distillation.nnodes=1", "distillation.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"]
    rows = distill(tmp_path / "run", *pool, "trainer.total_training_steps=2", "trainer.val_before_train=False")
    steps = [r for r in rows if "distillation/loss" in r]
    assert len(steps) == 2
    assert all(r["distillation/loss_min"] <= r["distillation/loss_max"] and "timing_s/teacher" in r for r in steps)


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


# long (tests/e2e/long_runs.sh): the preset's 60 steps, about a minute on 2 cores
@pytest.mark.long
def test_the_student_learns_from_the_teacher(tmp_path):
    rows = distill(tmp_path / "run")
    agreement = [r["distillation/abs_loss"] for r in rows if "distillation/abs_loss" in r]
    assert mean(agreement[-10:]) < 0.7 * mean(agreement[:10]), agreement  # measured: 0.44 to 0.12 (means of 10 steps)
    val = [r[VAL] for r in rows if VAL in r]
    assert val[-1] > val[0], val  # measured: 0.0, 0.0, 0.09, 0.04 (the teacher: about 0.11)
