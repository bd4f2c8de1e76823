"""The embedded code task for real (`rlrig train --preset code`): the preset starts `rlrig sandbox` beside the run
(reward_model.sandbox_fusion.url=local), every sample's program runs there against its row's test case, and the
score rises as the model learns to let the program compute the product."""

from pathlib import Path

import pytest

from tests.integration.test_train import metrics, rlrig

pytestmark = pytest.mark.integration

STEPS = 40
SCORE, VAL = "critic/score/mean", "val-core/codecontests/reward/mean@1"


def code_task(run: Path, *extra: str, steps: int = STEPS) -> tuple[list[dict], str]:
    """`rlrig train --preset code` for `steps` steps (validated at the start and the end): its metrics and output."""
    r = rlrig(
        "train",
        "--preset",
        "code",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        f"trainer.save_freq={steps}",
        f"trainer.default_local_dir={run}",
        *extra,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return metrics(run), r.stdout + r.stderr


def check_it_learned(rows: list[dict], steps: int = STEPS) -> tuple[float, float]:
    """The score over the first and the last fifth of the run's steps, and greedy validation before and after."""
    train = [r for r in rows if SCORE in r]
    k = max(1, steps // 5)
    first, last = (round(sum(r[SCORE] for r in part) / len(part), 3) for part in (train[:k], train[-k:]))
    val = [r[VAL] for r in rows if VAL in r]
    print({"score": (first, last), "validation": val})
    assert last > first + 0.2, (first, last)
    assert len(val) == 2 and val[-1] > val[0], val
    return first, last


# long: CI scores the preset's programs through the sandbox url=local starts
# (tests/unit/trainer/embedded/test_code_task.py)
@pytest.mark.long
def test_the_code_task_is_scored_by_the_sandbox_the_preset_starts(tmp_path):
    """Two steps: the sandbox starts beside the run and scores every sample. A codecontests row has no other scorer,
    and a program the sandbox does not run scores 0, so a score above 0 is programs that ran and printed the
    product; below 1, programs that ran and printed something else."""
    quick = ["trainer.val_before_train=False", "trainer.save_freq=0"]  # validated at the end only, not saved
    rows, out = code_task(tmp_path / "run", "actor_rollout_ref.rollout.name=hf", *quick, steps=2)
    assert "rlrig sandbox: http://127.0.0.1:" in out  # url=local started it
    assert [m["training/global_step"] for m in rows] == [1, 2]
    assert all(0.0 < m[SCORE] < 1.0 for m in rows), [m[SCORE] for m in rows]
    assert 0.0 < rows[-1][VAL] <= 1.0


# long: the learning run; CI keeps the sandbox's scoring in the test above
@pytest.mark.long
def test_the_embedded_code_task_learns_to_compute_in_its_program(tmp_path):
    check_it_learned(code_task(tmp_path / "run", "actor_rollout_ref.rollout.name=hf")[0])
