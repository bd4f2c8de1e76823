"""Micro batches by count or by token budget (use_dynamic_bsz), worked by hand, and their effect on a step."""

import pytest
import torch

from rlrig.trainer.model import micro_batches as batching
from rlrig.trainer.model.forward import in_micro_batches
from rlrig.trainer.workers.step.request import StepRequest

pytestmark = pytest.mark.process


@pytest.mark.parametrize(
    "lengths,parts,groups",
    [
        ([5, 1, 4, 2], 2, [[0, 1], [2, 3]]),  # 5 -> A, 4 -> B, 2 -> B (4 < 5), 1 -> A: loads 6, 6
        ([3, 3, 3], 3, [[0], [1], [2]]),
        ([10, 1, 1, 1], 2, [[0], [1, 2, 3]]),
        ([2, 2, 2, 2], 3, [[0, 3], [1], [2]]),  # ties: the group with fewer items, then the lower index
    ],
)
def test_balanced(lengths, parts, groups):
    assert batching.balanced(lengths, parts) == groups


@pytest.mark.parametrize(
    "lengths,budget,needed",
    [
        ([5, 1, 4, 2], 12, 1),
        ([5, 1, 4, 2], 6, 2),  # total 12 / 6: two groups of 6 fit
        ([5, 5, 5], 9, 3),  # ceil(15/9) = 2, but any two groups put 10 in one: 3
        ([7], 4, 1),  # longer than the budget: alone
    ],
)
def test_parts_needed(lengths, budget, needed):
    assert batching.parts_needed(lengths, budget) == needed


def test_token_budget_uses_the_count_all_ranks_agree_on():
    # this rank needs 1 micro batch; another needs 3: all run 3, balanced, row indices offset by start
    parts = batching.token_budget([9, 9, 2, 3, 1, 4], 2, 6, 100, agree=lambda k: max(k, 3))
    assert parts == [[5], [3], [2, 4]]


def test_results_come_back_in_row_order():
    x = torch.arange(6.0)
    out = in_micro_batches([[4, 1], [0, 5, 2], [3]], lambda p: x[p] * 10)
    assert out.tolist() == [0, 10, 20, 30, 40, 50]
    assert in_micro_batches(batching.fixed(0, 6, 4), lambda p: x[p]).tolist() == x.tolist()


def _one_step(extra):
    from rlrig.trainer.config.presets import EMBEDDED
    from rlrig.trainer.driver.single_process import single_worker

    # per-sequence loss aggregation: gradient accumulation over micro batches then gives the mini batch's
    # exact gradient however the sequences are grouped
    with single_worker(
        [
            *EMBEDDED,
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
            *extra,
        ]
    ) as (w, batches):
        calls = [0]
        h = w.models.actor.module.model.layers[0].self_attn.q_proj.register_forward_hook(
            lambda *a: calls.__setitem__(0, calls[0] + 1)
        )
        out = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.001))
        h.remove()
        return out, [p.detach().clone() for p in w.models.actor.module.parameters()], calls[0]


def test_dynamic_batches_train_like_fixed_ones_in_fewer_forwards():
    fixed_out, fixed_params, fixed_calls = _one_step(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"])
    # prompts up to 16 and responses up to 8 tokens: a budget of 160 tokens holds at least 6 sequences
    dyn_out, dyn_params, dyn_calls = _one_step(
        [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=160",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False",
        ]
    )
    # Adam's first step moves each weight by about lr (5e-4) x g / (|g| + eps): where |g| is near eps (1e-8), float
    # rounding in differently shaped micro batches moves it by a few 1e-6; a different gradient would move it by ~lr
    for a, b in zip(fixed_params, dyn_params):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert dyn_out["actor/grad_norm"] == pytest.approx(fixed_out["actor/grad_norm"], rel=1e-5)
    # fixed: 256 rows / 8 = 32 update forwards (+ the old-log-prob pass and generation, the same in both); dynamic:
    # the short sequences (about 10 real tokens) fill a 160-token budget with more than 8 each (seen: 20 forwards)
    assert dyn_calls < fixed_calls, (dyn_calls, fixed_calls)


def test_a_budget_below_one_sequence_is_refused():
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="log_prob_max_token_len_per_gpu=100 is shorter than one sequence"):
        parse_overrides(
            [
                "actor_rollout_ref.model.path=/m",
                "actor_rollout_ref.actor.use_dynamic_bsz=True",
                "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=100",
            ]
        )
