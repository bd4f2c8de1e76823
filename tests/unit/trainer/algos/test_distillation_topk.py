"""rlrig's top-k distillation loss (forward_kl_topk) against verl 0.9.1's own (verl_distillation_topk_golden.json,
written by verl_distillation_topk_golden.py): the student's log-probs of the teacher's top-k tokens taken from its
logits by model/topk_logprobs.py, then the loss and its metrics, direct and as a policy gradient, with and without
each clamp, with and without verl's engine workers' global batch."""

import json
from pathlib import Path

import pytest
import torch

from rlrig.trainer.algos import core_algos as A
from rlrig.trainer.algos.distillation import DistillationLoss, StudentTopK, distillation_loss
from rlrig.trainer.model.topk_logprobs import logprobs_at, teacher_topk

GOLDEN = json.loads(Path(__file__).with_name("verl_distillation_topk_golden.json").read_text())
CASES = GOLDEN["cases"]["forward_kl_topk"]
T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
EXACT, METRIC = 1e-12, 1e-8


def case_id(c) -> str:
    pg = "pg" if c["use_policy_gradient"] else "direct"
    glob = "global" if c["global"] else "local"
    return f"{c['agg']}-{pg}-min{c['log_prob_min_clamp']}-max{c['loss_max_clamp']}-{glob}"


def agg(c):
    g = c["global"]
    return c["agg"] if g is None else A.Agg(c["agg"], A.GlobalBatch(g["dp_size"], g["batch_num_tokens"], 10))


def config(c) -> DistillationLoss:
    args = (c["loss_max_clamp"], c["use_policy_gradient"], True, 0.2, 0.28, c["k"], c["log_prob_min_clamp"])
    return DistillationLoss("forward_kl_topk", 1.0, *args)


def test_the_fixture_covers_both_forms_and_every_clamp():
    assert GOLDEN["verl_release"] == "0.9.1"
    keys = ("use_policy_gradient", "log_prob_min_clamp", "loss_max_clamp", "global")
    assert len({tuple(c[k] is None if k == "global" else c[k] for k in keys) for c in CASES}) == 16


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_topk_loss_is_verls(case):
    ids = torch.tensor(case["teacher_ids"])
    student = StudentTopK(*logprobs_at(T(case["student_logits"]), ids))
    teacher = (T(case["teacher_logp"]), ids)
    args = (T(case["logp"]), T(case["old_logp"]), teacher, T(case["mask"]), config(case), agg(case))
    loss, metrics = distillation_loss(*args, student=student)
    assert loss.item() == pytest.approx(case["verl"], rel=EXACT, abs=EXACT)
    assert {k: float(v) for k, v in metrics.items()} == pytest.approx(case["verl_metrics"], rel=METRIC, abs=METRIC)


def test_the_direct_loss_moves_the_student_toward_the_teachers_top_k():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 10, requires_grad=True)
    t_logp, t_ids = teacher_topk(torch.randn(2, 3, 10) * 3, 4)
    cfg = DistillationLoss("forward_kl_topk", 1.0, None, False, True, 0.2, 0.2, 4, None)
    opt = torch.optim.SGD([logits], lr=5.0)
    mask = torch.ones(2, 3)
    losses = []
    for _ in range(100):
        student = StudentTopK(*logprobs_at(logits, t_ids))
        zero = torch.zeros(2, 3)
        loss, _ = distillation_loss(zero, zero, (t_logp, t_ids), mask, cfg, "token-mean", None, student)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_teacher_topk_is_the_k_likeliest_in_order_and_the_temperature_divides_the_student():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    logp, ids = teacher_topk(logits, 2)
    assert ids.tolist() == [[1, 3]]
    assert torch.allclose(logp, torch.log_softmax(logits, -1)[:, [1, 3]])
    at, own = logprobs_at(logits, torch.tensor([[2, 0]]), temperature=2.0)
    assert torch.allclose(at, torch.log_softmax(logits / 2, -1)[:, [2, 0]])
    assert own.tolist() == [[1, 3]]
