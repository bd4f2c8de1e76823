"""On-policy distillation for real (rlrig train --preset distill, the hf engine, CPU): the student's agreement
with the teacher and its score rise; the teacher in a pool of its own (distillation.nnodes) serves the training
worker through Ray; the top-k mode (forward_kl_topk) trains; two teachers, each scoring the samples of its
data_source, from a pool worker holding both; a sample no teacher's key matches is refused at start-up."""

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


# long: CI runs the teacher's pool with two teachers below (and one teacher's pool in one process,
# tests/unit/trainer/workers/test_distillation_step.py)
@pytest.mark.long
def test_the_teacher_in_a_pool_of_its_own_scores_the_samples(tmp_path):
    pool = ["distillation.nnodes=1", "distillation.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"]
    rows = distill(tmp_path / "run", *pool, "trainer.total_training_steps=2", "trainer.val_before_train=False")
    steps = [r for r in rows if "distillation/loss" in r]
    assert len(steps) == 2
    assert all(r["distillation/loss_min"] <= r["distillation/loss_max"] and "timing_s/teacher" in r for r in steps)


SHORT = ["trainer.total_training_steps=2", "trainer.val_before_train=False", "trainer.test_freq=0"]
TOPK = ["distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=8"]


# long: CI runs a top-k step in one process, here and on the pool (tests/unit/trainer/workers/test_distillation_step.py)
# and two top-k steps through vLLM (tests/vllm_tier/test_vllm_distillation.py)
@pytest.mark.long
def test_the_top_k_mode_trains_on_the_teachers_top_k(tmp_path):
    direct = [
        "distillation.distillation_loss.use_policy_gradient=False",
        "distillation.distillation_loss.loss_max_clamp=10",
    ]
    rows = distill(tmp_path / "run", *SHORT, *TOPK, *direct)
    steps = [r for r in rows if "distillation/loss" in r]
    assert len(steps) == 2
    for r in steps:
        assert 0 < r["distillation/student_mass"] <= 1 and 0 < r["distillation/teacher_mass"] <= 1
        assert 0 <= r["distillation/overlap_ratio"] <= 1 and r["distillation/loss_max"] > 0


def two_sources(path: Path) -> Path:
    """The embedded task's sums, every other row's data_source openai/gsm8k (its rule reads the same '#### n')."""
    from rlrig.trainer.data.datasets import arithmetic_rows, write_parquet

    rows = arithmetic_rows(64, "train", 0)
    for r in rows[1::2]:
        r["data_source"] = "openai/gsm8k"
    write_parquet(rows, path)
    return path


def teachers(*pairs: tuple[str, str, str]) -> list[str]:
    """(name, key, model path) of each teacher, as verl's multi-teacher example names them."""
    return [
        f"+distillation.teacher_models.{name}.{k}={v}"
        for name, key, path in pairs
        for k, v in (("key", key), ("model_path", path))
    ]


def test_two_teachers_on_a_pool_each_score_their_data_source(tmp_path):
    from rlrig.trainer.embedded.distill_student import ensure_student
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    data = two_sources(tmp_path / "train.parquet")
    named = teachers(("sums", "rlrig/arithmetic", ensure_tiny_model()), ("gsm", "openai/gsm8k", ensure_student()))
    pool = ["distillation.nnodes=1", "distillation.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"]
    run = tmp_path / "run"
    r = rlrig("train", "--preset", "distill", "trainer.save_freq=-1", f"trainer.default_local_dir={run}",
              f"data.train_files={data}", "distillation.teacher_models.teacher_model.model_path=null", *named, *pool,
              *SHORT, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [m for m in metrics(run) if "distillation/abs_loss" in m]
    assert len(steps) == 2 and all(m["distillation/abs_loss"] > 0 for m in steps)


# long: CI checks the refusal's line in tests/unit/trainer/config/test_distillation_keys.py
@pytest.mark.long
def test_a_sample_no_teacher_matches_is_refused_at_start_up(tmp_path):
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    data = two_sources(tmp_path / "train.parquet")
    named = teachers(("sums", "rlrig/arithmetic", ensure_tiny_model()), ("math", "lighteval/MATH", ensure_tiny_model()))
    r = rlrig("train", "--preset", "distill", f"data.train_files={data}",
              "distillation.teacher_models.teacher_model.model_path=null", *named, timeout=600)  # fmt: skip
    assert r.returncode == 2
    last = next(line for line in r.stderr.splitlines() if line.startswith("rlrig: error:"))
    assert "samples with data_source 'openai/gsm8k' match no teacher" in last, r.stderr[-2000:]
    assert "'rlrig/arithmetic', 'lighteval/MATH'" in last


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


# long (tests/e2e/long_runs.sh): the preset's 60 steps in the top-k mode as a direct loss
@pytest.mark.long
def test_the_student_learns_from_the_teachers_top_k(tmp_path):
    rows = distill(tmp_path / "run", *TOPK, "distillation.distillation_loss.use_policy_gradient=False")
    loss = [r["distillation/loss"] for r in rows if "distillation/loss" in r]
    assert mean(loss[-10:]) < 0.3 * mean(loss[:10]), loss  # measured: 0.186 to 0.011 (means of 10 steps)
    val = [r[VAL] for r in rows if VAL in r]
    assert val[-1] > val[0], val  # measured: 0.0, 0.039, 0.063, 0.078
