"""rlrig's on-policy distillation loss against verl 0.9.1's own (verl_distillation_golden.json, written by
verl_distillation_golden.py): every estimator mode, direct and as a policy gradient, with and without the clamp,
with and without verl's engine workers' global batch; and how it joins the task's loss (verl's
distillation_ppo_loss, re-derived)."""

import json
from pathlib import Path

import pytest
import torch

from rlrig.trainer.algos import core_algos as A
from rlrig.trainer.algos.distillation import ESTIMATOR_MODES, DistillationLoss, distillation_loss
from rlrig.trainer.config.schema import Config

GOLDEN = json.loads(Path(__file__).with_name("verl_distillation_golden.json").read_text())
CASES = GOLDEN["cases"]["distillation_loss"]
T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
EXACT, METRIC = 1e-12, 1e-8


def case_id(c) -> str:
    pg = "pg" if c["use_policy_gradient"] else "direct"
    return f"{c['loss_mode']}-{c['agg']}-{pg}-clamp{c['loss_max_clamp']}-{'global' if c['global'] else 'local'}"


def agg(c):
    g = c["global"]
    return c["agg"] if g is None else A.Agg(c["agg"], A.GlobalBatch(g["dp_size"], g["batch_num_tokens"], 10))


def test_the_fixture_covers_every_estimator_mode_both_ways():
    assert GOLDEN["verl_release"] == "0.9.1"
    assert {c["loss_mode"] for c in CASES} == set(ESTIMATOR_MODES)
    assert {(c["use_policy_gradient"], c["loss_max_clamp"] is None, c["global"] is None) for c in CASES} == {
        (pg, free, local) for pg in (False, True) for free in (False, True) for local in (False, True)
    }


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_distillation_loss_is_verls(case):
    cfg = DistillationLoss(case["loss_mode"], 1.0, case["loss_max_clamp"], case["use_policy_gradient"], True, 0.2, 0.28)
    weights = None if case["weights"] is None else T(case["weights"])
    args = (T(case["logp"]), T(case["old_logp"]), (T(case["teacher_logp"]), None), T(case["mask"]))
    loss, metrics = distillation_loss(*args, cfg, agg(case), weights)
    assert loss.item() == pytest.approx(case["verl"], rel=EXACT, abs=EXACT)
    assert {k: float(v) for k, v in metrics.items()} == pytest.approx(case["verl_metrics"], rel=METRIC, abs=METRIC)


def test_the_direct_loss_pulls_the_student_toward_the_teacher():
    # k3's gradient in log s is 1 - t/s: it raises log s where the teacher is likelier, lowers it where less
    logp = torch.tensor([[-2.0, -0.5]], requires_grad=True)
    teacher, mask = torch.tensor([[-0.5, -2.0]]), torch.ones(1, 2)
    cfg = DistillationLoss("k3", 1.0, None, False, True, 0.2, 0.2)
    loss, _ = distillation_loss(logp, logp.detach(), (teacher, None), mask, cfg, "token-mean")
    loss.backward()
    assert logp.grad[0, 0] < 0 < logp.grad[0, 1]


@pytest.mark.parametrize(
    "overrides, coef, task",
    [
        ({}, 1.0, True),
        ({"distillation_loss_coef": 0.3}, 0.3, True),
        # without task rewards verl's distillation_ppo_loss drops the policy loss and weighs the distillation by 1
        ({"distillation_loss_coef": 0.3, "use_task_rewards": False}, 1.0, False),
    ],
)
def test_how_it_joins_the_task_loss(overrides, coef, task):
    cfg = Config()
    cfg.distillation.enabled = True
    for k, v in overrides.items():
        setattr(cfg.distillation.distillation_loss, k, v)
    d = DistillationLoss.of(cfg)
    assert (d.coef, d.use_task_rewards) == (coef, task)
    assert DistillationLoss.of(Config()) is None
