"""rlrig's losses against verl 0.9.1's own functions on the same random inputs (verl_losses_golden.json, written by
verl_losses_golden.py): agg_loss in every mode without a global batch, every policy loss both have, the value loss
and the entropy loss, with and without the global batch of verl's engine workers."""

import json
from pathlib import Path

import pytest
import torch

from rlrig.trainer.algos import core_algos as A
from rlrig.trainer.algos import policy_losses
from rlrig.trainer.config.schema import ActorConfig

GOLDEN = json.loads(Path(__file__).with_name("verl_losses_golden.json").read_text())
CASES = GOLDEN["cases"]
T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
# the loss values agree to rounding; metrics are means over the mask, where verl adds 1e-8 to the token count
EXACT, METRIC = 1e-12, 1e-8


def agg(case) -> str | A.Agg:
    g = case["global"]
    if g is None:
        return case["mode"]
    return A.Agg(case["mode"], A.GlobalBatch(g["dp_size"], g["batch_num_tokens"], g["global_batch_size"]))


def case_id(case) -> str:
    return "-".join([case.get("loss_mode", ""), case["mode"], "global" if case["global"] else "local"]).strip("-")


def test_the_fixture_covers_every_mode_and_policy_loss_but_clip_cov():
    assert GOLDEN["verl_release"] == "0.9.1"
    assert {c["mode"] for c in CASES["agg_loss"]} == set(A.LOSS_AGG_MODES)
    assert {c["loss_mode"] for c in CASES["policy_loss"]} == set(policy_losses.POLICY_LOSSES) - {"clip_cov"}


@pytest.mark.parametrize("case", CASES["agg_loss"], ids=case_id)
def test_agg_loss(case):
    assert A.agg_loss(T(case["loss"]), T(case["mask"]), agg(case)).item() == pytest.approx(case["verl"], rel=EXACT)


def actor_config() -> ActorConfig:
    a = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    a.tau_pos, a.tau_neg = 1.0, 1.05
    a.policy_loss.kl_cov_ratio, a.policy_loss.ppo_kl_coef, a.policy_loss.dro_beta = 0.2, 0.1, 0.3
    return a


@pytest.mark.parametrize("case", CASES["policy_loss"], ids=case_id)
def test_policy_loss(case):
    weights = None if case["weights"] is None else T(case["weights"])
    args = [T(case[k]) for k in ("old_logp", "logp", "adv", "mask")]
    loss, metrics = policy_losses.get(case["loss_mode"]).fn(*args, actor_config(), agg(case), weights)
    assert loss.item() == pytest.approx(case["verl"], rel=EXACT, abs=EXACT)
    ours = {k: float(v) for k, v in metrics.items()}
    assert ours == pytest.approx(case["verl_metrics"], rel=METRIC, abs=METRIC)


@pytest.mark.parametrize("case", CASES["value_loss"], ids=case_id)
def test_value_loss(case):
    args = [T(case[k]) for k in ("values", "old_values", "returns", "mask")]
    loss, clipfrac = A.value_loss(*args, case["cliprange_value"], agg(case))
    assert [loss.item(), clipfrac.item()] == pytest.approx(case["verl"], rel=METRIC, abs=EXACT)


@pytest.mark.parametrize("case", CASES["entropy"], ids=case_id)
def test_entropy_loss(case):
    entropy = A.entropy_from_logprobs(torch.log_softmax(T(case["logits"]), -1))
    assert A.agg_loss(entropy, T(case["mask"]), agg(case)).item() == pytest.approx(case["verl"], rel=1e-10)
