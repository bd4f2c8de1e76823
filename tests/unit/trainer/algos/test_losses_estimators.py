"""verl's other policy losses and estimators against values worked by hand (the arithmetic in each comment)."""

import dataclasses
import math

import pytest
import torch

from rlrig.trainer.algos import estimators, policy_losses
from rlrig.trainer.config.schema import ActorConfig
from rlrig.trainer.workers.step.request import StepRequest

T = torch.tensor
LN2, LN15 = math.log(2), math.log(1.5)


def loss(name, old, logp, adv, mask, agg="token-mean", **cfg):
    actor = ActorConfig()
    for k, v in cfg.items():
        setattr(actor.policy_loss if hasattr(actor.policy_loss, k) else actor, k, v)
    return policy_losses.get(name).fn(T([old]), T([logp]), T([adv]), T([mask]), actor, agg)


@pytest.mark.parametrize(
    "name,old,logp,adv,mask,value,metrics",
    [
        # sequence ratio sqrt(2) (mean log ratio ln2/2) = 1.414 > 1.2: max(-1.414, -1.2) = -1.2 per token
        ("gspo", [0.0, 0.0], [LN2, 0.0], [1.0, 1.0], [1.0, 1.0], -1.2, {"actor/pg_clipfrac": 1.0}),
        # r = 1: gate sigmoid(0) * 4 / tau = 2 (tau_pos 1) -> -2 A
        ("sapo", [0.0], [0.0], [1.0], [1.0], -2.0, {}),
        # A < 0 uses tau_neg 1.05: 0.5 * 4 / 1.05 = 1.90476 -> +1.90476
        ("sapo", [0.0], [0.0], [-1.0], [1.0], 4 / 2.1, {}),
        # -log p A = -ln(0.5) * 2 = 1.3863
        ("gpg", [0.0], [math.log(0.5)], [2.0], [1.0], 2 * LN2, {}),
        # ratio 1.5 clipped to 1.2 as a constant weight: -1.2 * 1 * ln 1.5 = -0.48656
        ("cispo", [0.0], [LN15], [1.0], [1.0], -1.2 * LN15, {"actor/pg_clipfrac": 1.0}),
        # log ratios ln1.5 = 0.405 clipped to 0.2 in log space: r = e^0.2 = 1.2214, L = -1.2214
        ("geo_mean", [0.0, 0.0], [LN15, LN15], [1.0, 1.0], [1.0, 1.0], -math.exp(0.2), {"actor/pg_clipfrac": 1.0}),
        # the only token is already clipped: no covariance cut, plain clipped loss max(-1.5, -1.2) = -1.2
        ("clip_cov", [0.0], [LN15], [1.0], [1.0], -1.2, {"actor/pg_clipfrac": 0.0}),
        # ratios [2, 1, 1], A [1, 0, 0]: cov = (A - 1/3)(logp - ln2/3) is largest on token 0, which gets
        # + 0.1 |ln 2|: (-2 + 0.0693 + 0 + 0) / 3 = -0.64357; ppo_kl = mean |log ratio| = ln2 / 3
        (
            "kl_cov",
            [0.0, 0.0, 0.0],
            [LN2, 0.0, 0.0],
            [1.0, 0.0, 0.0],
            [1.0, 1.0, 1.0],
            (-2 + 0.1 * LN2) / 3,
            {"actor/ppo_kl": LN2 / 3},
        ),
    ],
)
def test_policy_losses(name, old, logp, adv, mask, value, metrics):
    out, m = loss(name, old, logp, adv, mask, kl_cov_ratio=0.34)
    assert float(out) == pytest.approx(value, abs=1e-4)
    for k, v in metrics.items():
        assert float(m[k]) == pytest.approx(v, abs=1e-4), k


def test_clip_cov_cuts_a_random_high_covariance_token():
    # ratios 1 (nothing clipped), A [1, -1], logp [0, -1]: cov = [0.5, 0.5], both inside (lb, ub); one of the two
    # tokens leaves the gradient: token-mean of [-1, 0] or [0, 1]
    out, m = loss("clip_cov", [0.0, -1.0], [0.0, -1.0], [1.0, -1.0], [1.0, 1.0], clip_cov_ratio=0.5, clip_cov_lb=0.0)
    assert float(out) in (pytest.approx(-0.5), pytest.approx(0.5)) and float(m["actor/pg_clipfrac"]) == 0.5


def test_vanilla_reports_the_dual_clip_fraction():
    # A = -1, ratio 5: max(5, 1.2) = 5 > c = 3, so the dual clip applies on that token
    _, m = loss("vanilla", [0.0, 0.0], [math.log(5.0), 0.0], [-1.0, 1.0], [1.0, 1.0])
    assert float(m["actor/pg_clipfrac_lower"]) == pytest.approx(0.5)


def est(name, scores, mask, index, norm=True):
    mask = T(mask)
    rewards = torch.zeros_like(mask)
    rewards[torch.arange(len(scores)), (mask.sum(-1) - 1).long()] = T(scores)
    x = estimators.AdvantageInput(rewards, mask, index, None, 1.0, 1.0, norm, lambda t: t)
    return estimators.get(name).fn(x)[0]


@pytest.mark.parametrize(
    "name,scores,mask,index,norm,first_token",
    [
        # group mean 0.25 -> [0.75, -0.25, -0.25, -0.25], whitened over the batch (unbiased std 0.5) -> [1.5, -0.5, ...]
        (
            "reinforce_plus_plus_baseline",
            [1.0, 0.0, 0.0, 0.0],
            [[1.0]] * 4,
            [0, 0, 0, 0],
            True,
            [1.5, -0.5, -0.5, -0.5],
        ),
        # length-weighted baseline (1 * 1 + 3 * 0) / 4 = 0.25 -> [0.75, -0.25]
        ("opo", [1.0, 0.0], [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]], [0, 0], True, [0.75, -0.25]),
        # best 1.0 over second 0.5: margin 0.5 / unbiased std of [1, 0.5, 0] (0.5) = 1.0; others 0
        ("grpo_passk", [1.0, 0.5, 0.0], [[1.0]] * 3, [0, 0, 0], True, [1.0, 0.0, 0.0]),
        ("grpo_passk", [1.0, 0.5, 0.0], [[1.0]] * 3, [0, 0, 0], False, [0.5, 0.0, 0.0]),
        # alpha = 4 samples / 1 non-zero = 4; centred [0.75, -0.25, -0.25, -0.25] x 4
        ("gpg", [1.0, 0.0, 0.0, 0.0], [[1.0]] * 4, [0, 0, 0, 0], True, [3.0, -1.0, -1.0, -1.0]),
        # rollout.n=1, as verl: a group of one has baseline 0 (GRPO: mean 0, std 1 -> s / (1 + 1e-6))
        ("grpo", [0.5, 1.0], [[1.0]] * 2, [0, 1], True, [0.5 / (1 + 1e-6), 1.0 / (1 + 1e-6)]),
        ("grpo", [0.5, 1.0], [[1.0]] * 2, [0, 1], False, [0.5, 1.0]),
        ("rloo", [0.5, 1.0], [[1.0]] * 2, [0, 1], True, [0.5, 1.0]),
        ("opo", [0.5, 1.0], [[1.0]] * 2, [0, 1], True, [0.5, 1.0]),
        # gpg: alpha = 2 samples / 2 non-zero = 1, groups of one keep their scores
        ("gpg", [0.5, 1.0], [[1.0]] * 2, [0, 1], True, [0.5, 1.0]),
    ],
)
def test_estimators(name, scores, mask, index, norm, first_token):
    adv = est(name, scores, mask, index, norm)
    assert adv[:, 0].tolist() == pytest.approx(first_token, abs=1e-4)
    assert (adv * (1 - T(mask)) == 0).all()


@pytest.mark.parametrize(
    "rewards, mask, baselines, advantages, returns",
    [
        # reward-to-go [1, 1, 1] minus the greedy response's 0.5 on every response token
        ([[0.0, 0.0, 1.0]], [[1.0, 1.0, 1.0]], [0.5], [[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]]),
        # a shorter response: padding stays 0; a KL-shaped reward counts from its token on: [2 - 0.5, 2, 0] - 1
        ([[-0.5, 2.0, 9.0]], [[1.0, 1.0, 0.0]], [1.0], [[0.5, 1.0, 0.0]], [[1.5, 2.0, 0.0]]),
        # a greedy response that scored higher than the sample: a negative advantage
        ([[0.0, 0.0]], [[1.0, 1.0]], [1.0], [[-1.0, -1.0]], [[0.0, 0.0]]),
    ],
)
def test_remax_by_hand(rewards, mask, baselines, advantages, returns):
    x = estimators.AdvantageInput(T(rewards), T(mask), [0], None, 1.0, 1.0, True, lambda t: t, torch.tensor(baselines))
    adv, ret = estimators.get("remax").fn(x)
    torch.testing.assert_close(adv, T(advantages))
    torch.testing.assert_close(ret, T(returns))


def test_every_registered_name_is_accepted_by_config():
    from rlrig.trainer.config.overrides import parse_overrides

    for name, est in estimators.ESTIMATORS.items():
        spp = f"actor_rollout_ref.actor.calculate_sum_pi_squared={est.needs_sum_pi_squared}"
        keys = "algorithm.gdpo_reward_keys=[acc]"  # read by gdpo alone, as in verl
        parse_overrides(
            [
                "actor_rollout_ref.model.path=/m",
                f"algorithm.adv_estimator={name}",
                "actor_rollout_ref.rollout.n=2",
                spp,
                keys,
            ]
        )
    for name in policy_losses.POLICY_LOSSES:
        pl = "actor_rollout_ref.actor.policy_loss"
        parse_overrides(["actor_rollout_ref.model.path=/m", f"{pl}.loss_mode={name}", f"{pl}.dro_beta=0.1"])


def test_remax_through_a_worker_scores_each_prompts_greedy_response():
    """The worker generates each prompt's greedy response once, scores it, and hands the estimator that score for
    each of the prompt's n samples."""
    from rlrig.trainer.batch.step_batch import StepBatch
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.reward.scoring import score_batch
    from rlrig.trainer.rollout.engines import GREEDY

    with single_worker(
        [
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "algorithm.adv_estimator=remax",
            "actor_rollout_ref.rollout.n=3",
            "actor_rollout_ref.rollout.name=hf",
        ]
    ) as (w, batches):
        seen, greedy = {}, []
        real_generate, real_fn = w.engine.generate, w.context.estimate

        def generate(prompts, n, sampling=None, **kw):
            ro = real_generate(prompts, n, sampling, **kw)
            if sampling == GREEDY:
                greedy.append(ro)
            return ro

        def fn(x):
            seen["baselines"] = x.baselines.clone()
            return real_fn(x)

        w.engine.generate = generate
        w.context = dataclasses.replace(w.context, estimate=fn)
        rows = next(batches)
        out = w.step(StepRequest(rows, global_step=1, kl_coef=0.0))
        assert len(greedy) == 1 and greedy[0].input_ids.shape[0] == len(rows)  # one greedy response per prompt
        expected = score_batch(w.tok, w.reward, rows, StepBatch.from_rollout(greedy[0], 1), 1).scores
        expected = expected.repeat_interleave(3)
        torch.testing.assert_close(seen["baselines"], expected.to(seen["baselines"].dtype))
        assert "timing_s/gen_max" in out
