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
        here = w.context.sources.teacher(batch)["teacher_logp"]
        pool = TeacherWorker(w.cfg.to_dict(), teacher, False).fields(batch)["teacher_logp"]
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


TOPK = ["distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=4"]


def forward_logp(path: str, ids: torch.Tensor) -> torch.Tensor:
    """The model's log-probs at the response positions of `ids` (prompt of 4), at temperature 1."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits[:, 3:-1].float(), -1)


def test_the_top_k_teacher_is_its_forwards_k_likeliest_here_and_in_its_pool():
    from rlrig.trainer.workers.teacher import TeacherWorker

    student, teacher = ensure_student(), ensure_tiny_model()
    ids = torch.randint(3, 20, (3, 9), generator=torch.Generator().manual_seed(1))
    batch = StepBatch(ids, torch.ones_like(ids), torch.ones(3, 5, dtype=torch.long), 4, torch.arange(3))
    with single_worker(distill(*TOPK, "actor_rollout_ref.rollout.temperature=0.7"), student) as (w, _):
        here = w.context.sources.teacher(batch)
        pool = TeacherWorker(w.cfg.to_dict(), teacher, False).fields(batch)
    expected = forward_logp(teacher, ids).topk(4, dim=-1)
    for got in (here, pool):
        torch.testing.assert_close(got["teacher_logp"], expected.values, atol=1e-5, rtol=1e-5)
        assert torch.equal(got["teacher_ids"], expected.indices)


def test_a_top_k_step_reports_verls_top_k_metrics_and_learns_from_the_teacher_alone():
    student = ensure_student()
    direct = [
        "distillation.distillation_loss.use_task_rewards=False",
        "distillation.distillation_loss.loss_max_clamp=10",
    ]
    m = run_steps(distill(*TOPK, *direct), 1, student)[0]
    topk = {"student_mass", "teacher_mass", "overlap_ratio", "overlap_token_advantage"}
    assert {f"distillation/{n}" for n in topk} <= set(m)
    assert 0 < m["distillation/student_mass"] <= 1 and 0 < m["distillation/teacher_mass"] <= 1
    assert m["distillation/student_mass_min"] <= m["distillation/student_mass"] <= m["distillation/student_mass_max"]
    assert 0 <= m["distillation/overlap_ratio"] <= 1
    assert 0 <= m["distillation/loss_min"] <= m["distillation/loss_max"] and m["actor/grad_norm"] > 0
    assert "distillation/abs_loss" not in m
    for name in set(m) - {M.TOKENS}:
        M.rule(name)


def test_each_sample_is_scored_by_its_own_teacher():
    """Two teachers by data_source: the embedded model for rlrig/arithmetic, the student itself for openai/gsm8k."""
    student, teacher = ensure_student(), ensure_tiny_model()
    named = ["distillation.enabled=True"] + [
        f"+distillation.teacher_models.{name}.{k}={v}"
        for name, key, path in (("sums", "rlrig/arithmetic", teacher), ("gsm", "openai/gsm8k", student))
        for k, v in (("key", key), ("model_path", path))
    ]
    ids = torch.randint(3, 20, (4, 9), generator=torch.Generator().manual_seed(2))
    batch = StepBatch(ids, torch.ones_like(ids), torch.ones(4, 5, dtype=torch.long), 4, torch.arange(4))
    batch = batch.replace(teacher=torch.tensor([0, 1, 1, 0]))
    with single_worker([*FAST, *named], student) as (w, _):
        got = w.context.sources.teacher(batch)["teacher_logp"]
    m = run_steps([*FAST, *named], 1, student)[0]
    targets = ids[:, 4:, None]
    sums, gsm = (forward_logp(p, ids).gather(-1, targets)[..., 0] for p in (teacher, student))
    torch.testing.assert_close(got[[0, 3]], sums[[0, 3]], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[[1, 2]], gsm[[1, 2]], atol=1e-5, rtol=1e-5)
    assert m["distillation/abs_loss"] > 0  # the embedded task's rows: all the sums teacher's


def test_one_teacher_named_in_teacher_models_place_scores_every_sample_here_and_in_its_pool():
    """verl drops teacher_model for the named ones; one named teacher then scores every sample, whatever its key."""
    from rlrig.trainer.workers.teacher import TeacherWorker

    student, teacher = ensure_student(), ensure_tiny_model()
    named = ["distillation.enabled=True", "+distillation.teacher_models.only.key=somewhere-else"]
    named.append(f"+distillation.teacher_models.only.model_path={teacher}")
    ids = torch.randint(3, 20, (2, 9), generator=torch.Generator().manual_seed(3))
    batch = StepBatch(ids, torch.ones_like(ids), torch.ones(2, 5, dtype=torch.long), 4, torch.arange(2))
    with single_worker([*FAST, *named], student) as (w, _):
        here = w.context.sources.teacher(batch)["teacher_logp"]
        pool = TeacherWorker(w.cfg.to_dict(), None, False).fields(batch)["teacher_logp"]
    expected = forward_logp(teacher, ids).gather(-1, ids[:, 4:, None])[..., 0]
    torch.testing.assert_close(here, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pool, expected, atol=1e-5, rtol=1e-5)
