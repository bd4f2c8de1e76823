"""Rollout correction (algorithm.rollout_correction.*): verl's truncated importance weights, rejection sampling and
bypass mode's loss between the actor's log-probs and the engine's, against hand-computed values and against verl's
own functions (verl_rollout_corr_golden.json, written by verl_rollout_corr_golden.py from verl's source), their
effect on every policy loss, and their keys at start-up."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlrig.trainer.algos.bypass_loss import bypass_loss
from rlrig.trainer.algos.policy_losses import POLICY_LOSSES
from rlrig.trainer.algos.rollout_correction import is_weights, rejection_mask
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.config.schema import ActorConfig
from rlrig.trainer.errors import ConfigError

VLLM = "actor_rollout_ref.rollout.name=vllm"  # an engine with log-probs of its own (rlrig's default, hf, has none)
GOLDEN = json.loads(Path(__file__).with_name("verl_rollout_corr_golden.json").read_text())

alone = lambda t: t  # noqa: E731  (one worker: the all-reduce is the identity)
L = math.log


def weights(log_ratio, mask, level, threshold=2.0, normalize=False, allreduce=alone):
    lr, m = torch.tensor(log_ratio), torch.tensor(mask)
    return is_weights(lr, torch.zeros_like(lr), m, level, threshold, normalize, allreduce)


@pytest.mark.parametrize(
    "log_ratio, mask, level, normalize, allreduce, expected, metrics",
    [
        # token: exp(old - engine) = [3, 0.5, pad] -> truncated at 2: [2, 0.5, 0]; mean before truncation (3 + 0.5) / 2
        (
            [[L(3), L(0.5), 5.0]],
            [[1.0, 1.0, 0.0]],
            "token",
            False,
            alone,
            [[2.0, 0.5, 0.0]],
            {
                "rollout_is_max": 3.0,
                "rollout_is_min": 0.5,
                "rollout_is_mean": 1.75,
                "rollout_is_ratio_fraction_high": 0.5,
                "rollout_is_ratio_fraction_low": 0.0,
            },
        ),
        # sequence: row 0 sums to ln 4 -> 4 -> 2 on both tokens; row 1 ln 0.5 -> 0.5 on its one token
        (
            [[L(2), L(2)], [L(0.5), 3.0]],
            [[1.0, 1.0], [1.0, 0.0]],
            "sequence",
            False,
            alone,
            [[2.0, 2.0], [0.5, 0.0]],
            {
                "rollout_is_max": 4.0,
                "rollout_is_min": 0.5,
                "rollout_is_mean": 8.5 / 3,
                "rollout_is_ratio_fraction_high": 0.5,
                "rollout_is_ratio_fraction_low": 0.0,
            },
        ),
        # batch-normalized token weights: [2, 0.5] / 1.25
        ([[L(3), L(0.5)]], [[1.0, 1.0]], "token", True, alone, [[1.6, 0.4]], {"rollout_is_batch_norm_factor": 1.25}),
        # ... with another worker's 2 tokens weighing 5 in all: mean (2.5 + 5) / 4 = 1.875
        (
            [[L(3), L(0.5)]],
            [[1.0, 1.0]],
            "token",
            True,
            lambda t: t + torch.tensor([5.0, 2.0]),
            [[2 / 1.875, 0.5 / 1.875]],
            {"rollout_is_batch_norm_factor": 1.875},
        ),
        # batch-normalized sequence weights: one per sequence, [2, 0.5] / 1.25
        (
            [[L(2), L(2)], [L(0.5), 3.0]],
            [[1.0, 1.0], [1.0, 0.0]],
            "sequence",
            True,
            alone,
            [[1.6, 1.6], [0.4, 0.0]],
            {"rollout_is_batch_norm_factor": 1.25},
        ),
        # a huge log ratio is clamped at 20 before exp, then truncated
        ([[50.0]], [[1.0]], "token", False, alone, [[2.0]], {"rollout_is_max": math.exp(20.0)}),
    ],
)
def test_weights_by_hand(log_ratio, mask, level, normalize, allreduce, expected, metrics):
    w, m = weights(log_ratio, mask, level, normalize=normalize, allreduce=allreduce)
    torch.testing.assert_close(w, torch.tensor(expected))
    assert not w.requires_grad
    for k, v in metrics.items():
        assert m[f"rollout_corr/{k}"] == pytest.approx(v, rel=1e-5), k


def test_weights_carry_no_gradient_to_the_log_probs():
    old = torch.tensor([[0.1, -0.2]], requires_grad=True)
    w, _ = is_weights(old, torch.zeros(1, 2), torch.ones(1, 2), "token", 2.0, False, alone)
    assert not w.requires_grad


def test_vanilla_weighs_each_tokens_loss_by_hand():
    # ratio 1 (old == new), A = [1, -1]: per-token loss -A r = [-1, 1]; weights [2, 0.5] -> [-2, 0.5]; token-mean -0.75
    cfg = parse_overrides([]).actor_rollout_ref.actor
    logp = torch.zeros(1, 2)
    loss, _ = POLICY_LOSSES["vanilla"].fn(
        logp, logp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), cfg, "token-mean", torch.tensor([[2.0, 0.5]])
    )
    assert loss.item() == pytest.approx(-0.75)


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_loss_takes_the_weights(name):
    """Weights of 1 change nothing; weights of 2 double the loss (every loss is linear in its tokens' weights,
    geo_mean through their geometric mean per sequence)."""
    cfg = parse_overrides(["actor_rollout_ref.actor.policy_loss.dro_beta=0.3"]).actor_rollout_ref.actor  # read by dro
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g)
    logp = old + 0.1 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.ones(3, 5)
    mask[2, 3:] = 0
    fn = POLICY_LOSSES[name].fn

    def run(w):
        torch.manual_seed(1)  # clip_cov draws the tokens it cuts out
        return fn(old, logp, adv, mask, cfg, "token-mean", w)[0]

    plain = run(None)
    assert run(torch.ones(3, 5)).item() == pytest.approx(plain.item(), rel=1e-6, abs=1e-7)
    assert run(torch.full((3, 5), 2.0)).item() == pytest.approx(2 * plain.item(), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.rollout_correction.rollout_is=geometric"], "choose token, sequence or null"),
        (
            ["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=0"],
            "must be positive",
        ),
        (
            ["algorithm.rollout_correction.rollout_is=token", "actor_rollout_ref.rollout.name=hf"],
            "the hf engine does not compute",
        ),
        # verl's older spellings of rollout_rs are not options at this commit
        (["algorithm.rollout_correction.rollout_rs=token"], "rollout_rs=token: 'token' is not one of token_k1,"),
        (["algorithm.rollout_correction.rollout_rs=geometric"], "'geometric' is not one of"),
        (["algorithm.rollout_correction.rollout_rs=seq_max_k1"], "'seq_max_k1' is not one of"),
        # an empty entry is dropped, as verl drops it: the one option then needs its threshold
        (["algorithm.rollout_correction.rollout_rs='token_k1,'"], "(rollout_rs=token_k1,): rejection sampling needs"),
        (["algorithm.rollout_correction.rollout_rs=','"], "',' is not one of"),
        (["algorithm.rollout_correction.rollout_rs=token_k1"], "rollout_rs_threshold=None (rollout_rs=token_k1): rej"),
        (
            [
                "algorithm.rollout_correction.rollout_rs=token_k2",
                "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",  # 0.5_2 is 0.52, as in Python
            ],
            "token_k2 takes one upper bound, not '0.5_2.0'",
        ),
        (
            [
                "algorithm.rollout_correction.rollout_rs='token_k1,token_k2'",
                "algorithm.rollout_correction.rollout_rs_threshold='1.5,2,3'",
            ],
            "give one threshold for all 2 options or one for each, not 3",
        ),
        (
            [
                "algorithm.rollout_correction.rollout_rs=token_k3",
                "algorithm.rollout_correction.rollout_rs_threshold=-1",
            ],
            "the bounds of token_k3 must be above 0",
        ),
        (
            [
                "algorithm.rollout_correction.rollout_rs=seq_sum_k1",
                "algorithm.rollout_correction.rollout_rs_threshold=0_2",
            ],
            "the bounds of seq_sum_k1 must be above 0",
        ),
        (
            [
                "algorithm.rollout_correction.rollout_rs=token_k1",
                "algorithm.rollout_correction.rollout_rs_threshold=abc",
            ],
            "'abc' for token_k1 is not a number or lower_upper",
        ),
        (
            [
                "algorithm.rollout_correction.rollout_rs=token_k1",
                "algorithm.rollout_correction.rollout_rs_threshold=[1]",
            ],
            "is not a number or lower_upper",  # verl takes a number or a string, not a list
        ),
        (["algorithm.rollout_correction.loss_type=gspo"], "loss_type=gspo: choose one of ppo_clip, reinforce"),
        (["algorithm.rollout_correction.bypass_mode=maybe"], "bypass_mode='maybe': expected True or False"),
        (
            ["algorithm.rollout_correction.bypass_mode=True", "actor_rollout_ref.rollout.name=hf"],
            "bypass_mode=True works on the engine's own log-probs, which the hf engine does not compute",
        ),
        (
            [
                "algorithm.rollout_correction.rollout_rs=token_k1",
                "algorithm.rollout_correction.rollout_rs_threshold=2",
                "actor_rollout_ref.rollout.name=hf",
            ],
            "rollout_rs=token_k1 works on the engine's own log-probs",
        ),
        (["algorithm.rollout_correction.rollout_token_veto_threshold=1e-4"], "token veto is not in its rollout corr"),
        (["algorithm.rollout_correction.rollout_rs_threshold_lower=0.5"], "both bounds go in"),
    ],
)
def test_config_refusals(overrides, message):
    with pytest.raises(ConfigError) as e:
        parse_overrides([VLLM, *overrides])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_verl_defaults_accepted():
    rc = parse_overrides(
        [
            "algorithm.rollout_correction.rollout_is=null",
            "algorithm.rollout_correction.rollout_rs=null",
            "algorithm.rollout_correction.bypass_mode=False",
            "algorithm.rollout_correction.loss_type=ppo_clip",
            "algorithm.rollout_correction.rollout_is_threshold=2.0",
        ]
    ).algorithm.rollout_correction
    assert rc.rollout_is is None and rc.rollout_is_threshold == 2.0
    assert rc.rollout_rs is None and rc.rollout_rs_threshold is None and not rc.bypass_mode
    assert rc.loss_type == "ppo_clip"


RC = "algorithm.rollout_correction"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=0.5_2.0"], ("token_k1", "0.5_2.0", False)),
        # verl's example script (examples/rollout_correction/run_with_rollout_corr_multi_rs.sh)
        (
            [f"{RC}.rollout_rs='token_k1,seq_max_k2'", f"{RC}.rollout_rs_threshold='0.6_1.6,2.5'"],
            ("token_k1,seq_max_k2", "0.6_1.6,2.5", False),
        ),
        # unquoted, as verl's fully async scripts pass it
        (
            [f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold=0.999_1.001"],
            ("seq_mean_k1", "0.999_1.001", False),
        ),
        ([f"{RC}.rollout_rs=seq_mean_k3", f"{RC}.rollout_rs_threshold=0.01"], ("seq_mean_k3", "0.01", False)),
        ([f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=1.3"], ("token_k1", "1.3", False)),
        (
            [f"{RC}.rollout_rs=' seq_sum_k2 ,seq_sum_k2'", f"{RC}.rollout_rs_threshold=1"],
            (" seq_sum_k2 ,seq_sum_k2", "1", False),
        ),
        ([f"{RC}.rollout_rs_threshold=abc"], (None, "abc", False)),  # verl reads it only with rollout_rs
        ([f"{RC}.bypass_mode=True", f"{RC}.loss_type=reinforce"], (None, None, True)),
        (
            [f"{RC}.bypass_mode=true", f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_batch_normalize=true"],
            (None, None, True),
        ),
    ],
)
def test_config_accepts(overrides, expected):
    rc = parse_overrides([VLLM, *overrides]).algorithm.rollout_correction
    assert (rc.rollout_rs, rc.rollout_rs_threshold, rc.bypass_mode) == expected


@pytest.mark.parametrize(
    "option",
    [
        "token_k1",
        "token_k2",
        "token_k3",
        "seq_sum_k1",
        "seq_sum_k2",
        "seq_sum_k3",
        "seq_mean_k1",
        "seq_mean_k2",
        "seq_mean_k3",
        "seq_max_k2",
        "seq_max_k3",
    ],
)
def test_every_verl_option_is_accepted(option):
    threshold = "0.5_2.0" if option.endswith("k1") else "0.1"
    parse_overrides([VLLM, f"{RC}.rollout_rs={option}", f"{RC}.rollout_rs_threshold={threshold}"])


# --- rejection sampling by hand: old log-probs r (the log ratio), the engine's 0 ---


def rejected(r, mask, rs, threshold):
    r, mask = torch.tensor(r, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64)
    return rejection_mask(r, torch.zeros_like(r), mask, rs, threshold)


@pytest.mark.parametrize(
    "r, mask, rs, threshold, kept, metrics",
    [
        # k1 = -r = [-ln3, -ln1.5, ln3] against [ln0.5, ln2] = [-0.693, 0.693]: only -ln1.5 = -0.405 within; the pad
        # token (r 9) counts nowhere; mean (-ln3 - ln1.5 + ln3) / 3
        (
            [[L(3), L(1.5), -L(3), 9.0]],
            [[1, 1, 1, 0]],
            "token_k1",
            "0.5_2.0",
            [[0, 1, 0, 0]],
            {
                "rollout_rs_token_k1_mean": -L(1.5) / 3,
                "rollout_rs_token_k1_fraction_high": 1 / 3,
                "rollout_rs_token_k1_fraction_low": 1 / 3,
                "rollout_rs_token_k1_masked_fraction": 2 / 3,
                "rollout_rs_masked_fraction": 2 / 3,
                "rollout_rs_seq_masked_fraction": 1.0,
            },
        ),
        # one number for k1: upper 1.25, lower 1/1.25 = 0.8; k1 = [ln1.2, ln1.3, -ln1.2] against [-0.223, 0.223]
        ([[-L(1.2), -L(1.3), L(1.2)]], [[1, 1, 1]], "token_k1", "1.25", [[1, 0, 1]], {}),
        # k2 = r^2 / 2 = [[0.02, 0.08], [0.32, 0]]: sequence means 0.05 (kept) and 0.16 (> 0.1, the row rejected);
        # the statistic's token mean (0.05 x 2 + 0.16 x 2) / 4 = 0.105, its share over sequences above 0.1: 1 / 2
        (
            [[0.2, 0.4], [0.8, 0.0]],
            [[1, 1], [1, 1]],
            "seq_mean_k2",
            "0.1",
            [[1, 1], [0, 0]],
            {
                "rollout_rs_seq_mean_k2_mean": 0.105,
                "rollout_rs_seq_mean_k2_max": 0.16,
                "rollout_rs_seq_mean_k2_fraction_high": 0.5,
                "rollout_rs_masked_fraction": 0.5,
                "rollout_rs_seq_masked_fraction": 0.5,
            },
        ),
        # k3 = e^r - 1 - r = [0, 2 - 1 - ln2 = 0.3069]: the sequence's max is above 0.3
        ([[0.0, L(2)]], [[1, 1]], "seq_max_k3", "0.3", [[0, 0]], {"rollout_rs_seq_max_k3_max": 1 - L(2)}),
        # both must pass: token_k1 rejects r = 1 (k1 = -1 < ln0.5); seq_sum_k2 rejects row 1 (0.045 + 0.5 > 0.1)
        (
            [[0.1, 0.2], [0.3, 1.0]],
            [[1, 1], [1, 1]],
            "token_k1,seq_sum_k2",
            "0.5_2.0,0.1",
            [[1, 1], [0, 0]],
            {
                "rollout_rs_token_k1_masked_fraction": 0.25,
                "rollout_rs_seq_sum_k2_masked_fraction": 0.5,
                "rollout_rs_seq_sum_k2_max": 0.545,
                "rollout_rs_masked_fraction": 0.5,
            },
        ),
    ],
)
def test_rejection_by_hand(r, mask, rs, threshold, kept, metrics):
    out, m = rejected(r, mask, rs, threshold)
    assert out.tolist() == kept
    for k, v in metrics.items():
        assert m[f"rollout_corr/{k}"] == pytest.approx(v, rel=1e-9, abs=1e-12), k


# --- bypass mode's loss by hand (actor defaults: clip 0.2); log-probs of 0.5, 0.25 ... ---


def bypass(engine, logp, adv, mask, **rc):
    cfg = {"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": False}
    cfg |= {"rollout_rs": None, "rollout_rs_threshold": None, "loss_type": "reinforce", **rc}
    logp = torch.tensor(logp, dtype=torch.float64).log().requires_grad_(True)
    engine, adv, mask = (torch.tensor(x, dtype=torch.float64) for x in (engine, adv, mask))
    loss, m = bypass_loss(SimpleNamespace(**cfg), alone)(engine.log(), logp, adv, mask, ActorConfig(), "token-mean")
    loss.backward()
    return loss.item(), logp.grad, m


@pytest.mark.parametrize(
    "engine, logp, adv, mask, rc, loss, grad, metrics",
    [
        # REINFORCE: L = mean(-A logp) = -(1 ln0.5 + 2 ln0.25) / 2 = 2.5 ln2; dL/dlogp = -A / 2
        ([[0.5, 0.25]], [[0.5, 0.25]], [[1.0, 2.0]], [[1, 1]], {}, 2.5 * L(2), [[-0.5, -1.0]], {"actor/ppo_kl": 0.0}),
        # REINFORCE with token weights: w = min(0.5 / 0.25, 2) = 2, a constant: L = -1 ln0.5 2 = 2 ln2, grad -A w = -2;
        # actor/ppo_kl = mean(engine - logp) = ln0.25 - ln0.5 = -ln2
        (
            [[0.25]],
            [[0.5]],
            [[1.0]],
            [[1]],
            {"rollout_is": "token"},
            2 * L(2),
            [[-2.0]],
            {"actor/ppo_kl": -L(2), "rollout_corr/rollout_is_mean": 2.0},
        ),
        # PPO's clip: ratio 0.55 / 0.5 = 1.1 (inside 1 +- 0.2), L = -A r = -1.1, grad -A r = -1.1; the weight (1.1) is
        # reported, not applied
        (
            [[0.5]],
            [[0.55]],
            [[1.0]],
            [[1]],
            {"rollout_is": "token", "loss_type": "ppo_clip"},
            -1.1,
            [[-1.1]],
            {"rollout_corr/rollout_is_mean": 1.1, "actor/pg_clipfrac": 0.0},
        ),
        # rejection against the current policy: r = logp - engine = [0, ln2], k1 = [0, -ln2] against
        # [ln0.9, ln1.1] = [-0.105, 0.095]: token 2 leaves the loss, L = -ln0.5 = ln2, its gradient 0
        (
            [[0.5, 0.25]],
            [[0.5, 0.5]],
            [[1.0, 1.0]],
            [[1, 1]],
            {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.9_1.1"},
            L(2),
            [[-1.0, 0.0]],
            {"rollout_corr/rollout_rs_masked_fraction": 0.5, "actor/ppo_kl": 0.0},
        ),
    ],
)
def test_bypass_loss_by_hand(engine, logp, adv, mask, rc, loss, grad, metrics):
    got, g, m = bypass(engine, logp, adv, mask, **rc)
    assert got == pytest.approx(loss, rel=1e-9)
    torch.testing.assert_close(g, torch.tensor(grad, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    for k, v in metrics.items():
        value = m[k].item() if torch.is_tensor(m[k]) else m[k]
        assert value == pytest.approx(v, rel=1e-9, abs=1e-12), k


# --- against verl's own functions (verl_rollout_corr_golden.json) ---


# verl's masked means divide by n + 1e-8, rlrig's by n: in float64 a relative 1e-8 / n apart (in float32, where
# training runs, the same number)
REL = 1e-7


def tensors(case, *keys):
    return [torch.tensor(case[k], dtype=torch.float64) for k in keys]


def assert_metrics(got: dict, verl: dict):
    """Every metric rlrig reports equals verl's of that name (verl's helpers leave rollout_corr/ off)."""
    verl = {k if k.startswith(("actor/", "rollout_corr/")) else f"rollout_corr/{k}": v for k, v in verl.items()}
    for k, v in got.items():
        v = v.item() if torch.is_tensor(v) else v
        assert v == pytest.approx(verl[k], rel=REL, abs=1e-9), k  # a std, E[s^2] - E[s]^2, loses digits


def test_the_golden_file_is_verls_commit():
    assert GOLDEN["verl_commit"] == "b178a3cd56f58b2d502255daba591e92833930a7"
    assert {k: len(v) for k, v in GOLDEN["cases"].items()} == {"rejection": 18, "weights": 4, "bypass": 11}


@pytest.mark.parametrize("case", GOLDEN["cases"]["rejection"], ids=lambda c: f"{c['rollout_rs']}={c['threshold']}")
def test_rejection_equals_verls(case):
    """The new mask and every metric of verl's compute_rollout_rejection_mask, the threshold as the config holds it
    (a string)."""
    old, engine, mask = tensors(case, "old", "engine", "mask")
    kept, m = rejection_mask(old, engine, mask, case["rollout_rs"], str(case["threshold"]))
    assert kept.tolist() == case["kept"]
    assert set(m) == {f"rollout_corr/{k}" for k in case["metrics"]}
    assert_metrics(m, case["metrics"])


@pytest.mark.parametrize("case", GOLDEN["cases"]["weights"], ids=lambda c: f"{c['rollout_is']}-{c['batch_normalize']}")
def test_weights_equal_verls(case):
    """verl's compute_rollout_correction_weights; rlrig reports six of its metrics."""
    old, engine, mask = tensors(case, "old", "engine", "mask")
    w, m = is_weights(old, engine, mask, case["rollout_is"], case["threshold"], case["batch_normalize"], alone)
    torch.testing.assert_close(w, torch.tensor(case["is_weights"], dtype=torch.float64), rtol=REL, atol=1e-12)
    assert_metrics(m, case["metrics"])


@pytest.mark.parametrize(
    "case",
    GOLDEN["cases"]["bypass"],
    ids=lambda c: f"{c['loss_type']}-{c['rollout_is']}-{c['rollout_rs']}-{c['loss_agg_mode']}",
)
def test_bypass_loss_equals_verls(case):
    """verl's compute_policy_loss_bypass_mode: the loss, its gradient and the metrics rlrig reports (all of verl's but
    its off-policy diagnostics, rollout_corr/{kl,k3_kl,*ppl*,chi2_*}, and six of its weights' metrics)."""
    old, engine, mask, adv = tensors(case, "old", "engine", "mask", "adv")
    keys = ("loss_type", "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs")
    threshold = case["rollout_rs_threshold"]  # a string, as the config holds it
    rc = SimpleNamespace(
        **{k: case[k] for k in keys}, rollout_rs_threshold=None if threshold is None else str(threshold)
    )
    actor = ActorConfig(**case["actor"])
    logp = old.clone().requires_grad_(True)
    loss, m = bypass_loss(rc, alone)(engine, logp, adv, mask, actor, case["loss_agg_mode"])
    loss.backward()
    assert loss.item() == pytest.approx(case["loss"], rel=REL, abs=1e-12)
    torch.testing.assert_close(logp.grad, torch.tensor(case["grad"], dtype=torch.float64), rtol=REL, atol=1e-12)
    rs = {k for k in case["metrics"] if k.startswith("rollout_corr/rollout_rs_")}
    assert rs == {k for k in m if k.startswith("rollout_corr/rollout_rs_")} and set(m) <= set(case["metrics"])
    assert_metrics(m, case["metrics"])
