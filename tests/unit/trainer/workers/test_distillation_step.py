"""On-policy distillation through a training worker (the single worker, hf engine, CPU): the teacher's log-probs
of the student's samples at temperature 1, held here or by a TeacherWorker of its own pool, the same; the loss
joined to the task's as verl's distillation_ppo_loss; its metrics under verl's names, each with a rule."""

import pytest
import torch

from rlrig.trainer import metrics as M
from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.driver.single_process import run_steps, single_worker
from rlrig.trainer.embedded.distill_student import ensure_student
from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

pytestmark = pytest.mark.process

FAST = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.device=cpu",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.max_response_length=8",
        "actor_rollout_ref.rollout.name=hf", "trainer.total_training_steps=2"]  # fmt: skip


def distill(*extra: str) -> list[str]:
    teacher = ensure_tiny_model()
    return [
        *FAST,
        "distillation.enabled=True",
        f"distillation.teacher_models.teacher_model.model_path={teacher}",
        *extra,
    ]


def test_the_teachers_log_probs_are_its_forward_at_temperature_one_here_and_in_its_pool():
    from rlrig.trainer.workers.teacher import TeacherWorker

    student, teacher = ensure_student(), ensure_tiny_model()
    cfg_over = distill("actor_rollout_ref.rollout.temperature=0.7")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 20, (3, 9), generator=g)
    batch = StepBatch(ids, torch.ones_like(ids), torch.ones(3, 5, dtype=torch.long), 4, torch.arange(3))
    with single_worker(cfg_over, student) as (w, _):
        here = w.context.sources.teacher(batch)
        pool = TeacherWorker(w.cfg.to_dict(), teacher, False).logprobs(batch)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(teacher).eval()
    with torch.no_grad():
        logits = model(ids).logits[:, 3:-1].float()
    expected = torch.log_softmax(logits, -1).gather(-1, ids[:, 4:, None])[..., 0]
    torch.testing.assert_close(here, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool, expected, atol=1e-5, rtol=1e-5)


def test_a_distillation_step_reports_verls_metrics_and_joins_the_task_loss():
    student = ensure_student()
    plain = run_steps(FAST, 1, student)[0]
    zero = run_steps(distill("distillation.distillation_loss.distillation_loss_coef=0.0"), 1, student)[0]
    alone = run_steps(distill("distillation.distillation_loss.use_task_rewards=False"), 1, student)[0]
    pg = run_steps(
        distill(
            "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.use_policy_gradient=True"
        ),
        1,
        student,
    )[0]
    # coefficient 0 with the task's loss: the update is the plain run's (same seeds, same samples)
    assert zero["actor/grad_norm"] == pytest.approx(plain["actor/grad_norm"], rel=1e-6)
    assert zero["critic/score/mean"] == plain["critic/score/mean"]
    # without task rewards the gradient is the distillation's alone
    assert alone["actor/grad_norm"] != pytest.approx(plain["actor/grad_norm"], rel=1e-3)
    for m in (zero, alone, pg):
        assert m["distillation/loss_min"] <= m["distillation/abs_loss"] <= m["distillation/loss_max"]
        assert "timing_s/teacher" in m
    assert {"distillation/pg_clipfrac", "distillation/ppo_kl", "distillation/pg_clipfrac_lower"} <= set(pg)
    assert "distillation/pg_clipfrac" not in alone
    for name in {*pg, *alone} - {M.TOKENS}:
        M.rule(name)  # every metric combines across workers by a declared rule
