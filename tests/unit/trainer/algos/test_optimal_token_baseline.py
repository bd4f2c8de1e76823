"""The optimal token baseline (algos/estimators/optimal_token_baseline.py), its sum of pi squared
(model/chunked_logprobs.py) and the variance_proxy/* metrics (algos/variance_proxy.py): against values worked by
hand, against verl's own functions (verl_otb_golden.json, written by verl_otb_golden.py), and the keys that turn
them on."""

import json
import math
from pathlib import Path

import pytest
import torch

from rlrig.trainer.algos.estimators import AdvantageInput, get
from rlrig.trainer.algos.estimators.optimal_token_baseline import otb_advantages, tir_otb_advantages
from rlrig.trainer.algos.variance_proxy import variance_proxy_metrics
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.model import chunked_logprobs
from rlrig.trainer.model.chunked_logprobs import token_sum_pi_squared

T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
GOLDEN = json.loads(Path(__file__).with_name("verl_otb_golden.json").read_text())
HALF, QUARTER = math.log(0.5), math.log(0.25)

# (fn, rewards, mask, index, old log-probs, sum_pi_squared, IS weights, zero_tail, advantages)
# w_t = 1 - 2 pi_t + sum pi^2: pi = 0.5 and sum pi^2 = 0.5 give w = 0.5; pi = 0.25, sum pi^2 = 0.25 give w = 0.75
BY_HAND = [
    # equal paths: B_t = the group's mean return-to-go; G0 = [1, 1], G1 = [0, 0], B = 0.5
    (otb_advantages, [[0, 1], [0, 0]], [[1, 1], [1, 1]], [0, 0], [[HALF] * 2] * 2, [[0.5] * 2] * 2, None, False,
     [[0.5, 0.5], [-0.5, -0.5]]),
    # W0 = 0.5, W1 = 0.75: B = (1 * 0.5 + 0 * 0.75) / 1.25 = 0.4
    (otb_advantages, [[1], [0]], [[1], [1]], [0, 0], [[HALF], [QUARTER]], [[0.5], [0.25]], None, False,
     [[0.6], [-0.4]]),
    # rollout IS: w0 = 0.5 * 2^2 = 2, w1 = 0.5 * 1^2 = 0.5: B = 2 / 2.5 = 0.8
    (otb_advantages, [[1], [0]], [[1], [1]], [0, 0], [[HALF], [HALF]], [[0.5], [0.5]], [[2.0], [1.0]], False,
     [[0.2], [-0.8]]),
    # lengths 1 and 2: G0 = [1, 0], G1 = [1, 1]; W0 m0 = [0.5, 0], W1 = [0.5, 1]: B = [1, 1], every advantage 0
    (otb_advantages, [[1, 0], [0, 1]], [[1, 0], [1, 1]], [0, 0], [[HALF] * 2] * 2, [[0.5] * 2] * 2, None, False,
     [[0, 0], [0, 0]]),
    # the same with zero_tail: the longest sample's baseline past length 1 is 0, so A1 = [1 - 1, 1 - 0]
    (otb_advantages, [[1, 0], [0, 1]], [[1, 0], [1, 1]], [0, 0], [[HALF] * 2] * 2, [[0.5] * 2] * 2, None, True,
     [[0, 0], [0, 1]]),
    # a group of one: baseline 0, A = G = [2, 2]
    (otb_advantages, [[0, 2]], [[1, 1]], [7], [[HALF] * 2], [[0.5] * 2], None, False, [[2, 2]]),
    # a hole at sample 0's first token: G0 = [1, 1, 1], G1 = [0, 0, 0]; W0 m0 = [0, 0.5, 1], W1 m1 = [0.5, 1, 0]
    # B = [0 / 0.5, (0.5 + 0) / 1.5, 1 / 1] = [0, 1/3, 1]: A0 = [0, 2/3, 0], A1 = [0, -1/3, 0]
    (otb_advantages, [[0, 0, 1], [0, 0, 0]], [[0, 1, 1], [1, 1, 0]], [0, 0], [[HALF] * 3] * 2, [[0.5] * 3] * 2,
     None, False, [[0, 2 / 3, 0], [0, -1 / 3, 0]]),
    # TIR lines tokens up by their order instead: packed W0 = [0.5, 1], W1 = [0.5, 1], G0 = [1, 1], G1 = [0, 0]
    # B = [0.5, 0.5]: A0 = [0, 0.5, 0.5] (its columns 1, 2), A1 = [-0.5, -0.5, 0]
    (tir_otb_advantages, [[0, 0, 1], [0, 0, 0]], [[0, 1, 1], [1, 1, 0]], [0, 0], [[HALF] * 3] * 2,
     [[0.5] * 3] * 2, None, False, [[0, 0.5, 0.5], [-0.5, -0.5, 0]]),
    # TIR: a sample without tokens is in no group, so the other is alone (baseline 0): A0 = G0 = [1, 1]
    (tir_otb_advantages, [[0, 1], [0, 0]], [[1, 1], [0, 0]], [0, 0], [[HALF] * 2] * 2, [[0.5] * 2] * 2, None, True,
     [[1, 1], [0, 0]]),
]  # fmt: skip


@pytest.mark.parametrize("fn,rewards,mask,index,old,spp,is_w,zero_tail,expected", BY_HAND)
def test_advantages_by_hand(fn, rewards, mask, index, old, spp, is_w, zero_tail, expected):
    is_w = T(is_w) if is_w is not None else None
    adv, _ = fn(T(rewards), T(mask), index, T(old), T(spp), is_w, zero_tail)
    torch.testing.assert_close(adv, T(expected), atol=1e-6, rtol=0)


@pytest.mark.parametrize("case", GOLDEN["cases"]["estimator"], ids=lambda c: f"{c['estimator']}")
def test_advantages_match_verls(case):
    fn = {"otb": otb_advantages, "tir": tir_otb_advantages}[case["estimator"]]
    is_w = T(case["is_weights"]) if case["is_weights"] is not None else None
    args = (T(case["rewards"]), T(case["mask"]), case["index"], T(case["old"]), T(case["spp"]), is_w)
    adv, ret = fn(*args, zero_tail=case["handle_zero_tail"])
    torch.testing.assert_close(adv, T(case["advantages"]), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(ret, T(case["returns"]), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name,zero_tail", [("optimal_token_baseline", True), ("tir_optimal_token_baseline", True)])
def test_registered_with_verls_zero_tail_and_the_old_pass_inputs(name, zero_tail):
    case = GOLDEN["cases"]["estimator"][3]  # IS weights, empty row, holes: tells the variants and settings apart
    is_w = T(case["is_weights"])
    x = AdvantageInput(T(case["rewards"]), T(case["mask"]), case["index"], None, 1.0, 1.0, True, lambda t: t)
    x.old_logp, x.sum_pi_squared, x.is_weights = T(case["old"]), T(case["spp"]), is_w
    est = get(name)
    assert est.needs_sum_pi_squared and not est.needs_critic
    fn = otb_advantages if name.startswith("optimal") else tir_otb_advantages
    expected = fn(T(case["rewards"]), T(case["mask"]), case["index"], T(case["old"]), T(case["spp"]), is_w, zero_tail)
    for got, want in zip(est.fn(x), expected):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", GOLDEN["cases"]["variance_proxy"], ids=lambda c: f"grad_norm={c['grad_norm']}")
def test_variance_proxy_matches_verls(case):
    is_w = T(case["is_weights"]) if case["is_weights"] is not None else None
    args = (T(case["advantages"]), T(case["old"]), T(case["spp"]), T(case["mask"]), is_w, case["grad_norm"])
    whole = variance_proxy_metrics(*args, lambda t: t)
    assert whole == pytest.approx(case["metrics"], rel=1e-9, abs=1e-12)
    # two workers, each with half the rows: the all-reduce sums both halves' sums, and each reports the whole's numbers
    halves = [[a[rows] if torch.is_tensor(a) else a for a in args] for rows in (slice(0, 4), slice(4, 8))]
    total = _handed_to_allreduce(halves[0]) + _handed_to_allreduce(halves[1])
    for half in halves:
        assert variance_proxy_metrics(*half, lambda t: total) == pytest.approx(case["metrics"], rel=1e-9, abs=1e-12)


def _handed_to_allreduce(args) -> torch.Tensor:
    handed = []
    variance_proxy_metrics(*args, lambda t: handed.append(t) or t)
    return handed[0]


@pytest.mark.parametrize("case", GOLDEN["cases"]["sum_pi_squared"], ids=range(3))
def test_sum_pi_squared_matches_verls(case):
    got = token_sum_pi_squared(T(case["logits"])).double()  # computed in fp32
    torch.testing.assert_close(got, T(case["sum_pi_squared"]), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [2**25, 3 * 50])  # one chunk; chunks of 3 tokens (an uneven last one)
def test_chunked_sum_pi_squared_is_the_softmax_squared(monkeypatch, dtype, chunk):
    monkeypatch.setattr(chunked_logprobs, "CHUNK_ELEMENTS", chunk)
    logits = (4 * torch.randn(2, 7, 50, generator=torch.Generator().manual_seed(0))).to(dtype)
    got = token_sum_pi_squared(logits)
    assert got.dtype == torch.float32 and got.shape == (2, 7)
    torch.testing.assert_close(got, torch.softmax(logits.float(), -1).pow(2).sum(-1), atol=1e-6, rtol=1e-5)


MODEL = "actor_rollout_ref.model.path=/m"
OTB = "algorithm.adv_estimator=optimal_token_baseline"
ON = "actor_rollout_ref.actor.calculate_sum_pi_squared=True"


@pytest.mark.parametrize(
    "overrides,refusal",
    [
        ([OTB, ON], None),
        (["algorithm.adv_estimator=tir_optimal_token_baseline", ON], None),
        (["algorithm.adv_estimator=grpo", ON], None),  # the variance_proxy/* metrics only
        ([OTB, ON, "actor_rollout_ref.actor.sum_pi_squared_checkpointing=True"], None),  # changes nothing here
        ([OTB], "set actor_rollout_ref.actor.calculate_sum_pi_squared=True"),
        ([OTB, ON, "algorithm.rollout_correction.bypass_mode=True"], "bypass_mode=True skips"),
        (
            [ON, "actor_rollout_ref.actor.use_prefix_grouper=True", "actor_rollout_ref.model.use_remove_padding=False"],
            "not computed with use_prefix_grouper=True",
        ),
    ],
)
def test_config_accepts_and_refuses(overrides, refusal):
    if refusal is None:
        cfg = parse_overrides([MODEL, *overrides])
        assert cfg.actor_rollout_ref.actor.calculate_sum_pi_squared
        return
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, *overrides])
    assert refusal in str(e.value) and "\n" not in str(e.value)
