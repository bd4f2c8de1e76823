"""DAPO's group filter (algorithm.filter_groups): which groups are kept, and each sample's value of the metric, against
hand-worked cases, verl's DAPO recipe's rule (transcribed below: the recipe keeps it inline in its trainer's loop)
and verl 0.9.1's own filter function (its v1 replay buffer's, whose module needs transfer_queue: recorded on seeded
random values by verl_filter_groups_golden.py into the .json beside it)."""

import json
import pathlib
from collections import defaultdict

import numpy as np
import pytest
import torch

from rlrig.trainer.algos.filter_groups import kept_groups, sample_values
from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.reward.managers import Overlong
from rlrig.trainer.reward.scoring import RewardSource, score, score_batch_with_fields
from rlrig.trainer.rollout.engines.base import pack_responses


def verl_recipe_kept(uids: list[str], values: list) -> list[str]:
    """verl-recipe dapo/dapo_ray_trainer.py, fit(): the kept prompt uids, in their first sample's order."""
    prompt_uid2metric_vals = defaultdict(list)
    for uid, metric_val in zip(uids, values, strict=True):
        prompt_uid2metric_vals[uid].append(metric_val)
    prompt_uid2metric_std = {uid: np.std(vals) for uid, vals in prompt_uid2metric_vals.items()}
    return [uid for uid, std in prompt_uid2metric_std.items() if std > 0 or len(prompt_uid2metric_vals[uid]) == 1]


@pytest.mark.parametrize(
    "values, n, kept",
    [
        ([1, 1, 0, 1, 0, 0], 2, [False, True, False]),  # all right, mixed, all wrong
        ([1.0, 1.0, 1.0, 0.5, 0.5, 0.5], 3, [False, False]),
        ([0.0, 1e-9, 2.0, 2.0], 2, [True, False]),  # any difference keeps it
        ([True, False, True, True], 2, [True, False]),  # boolean fields (verl's `overlong`)
        ([3, 3, 3], 1, [True, True, True]),  # n = 1: a group of one sample is kept (verl's len == 1 case)
        ([-1.0, -1.0, -1.0, -1.0], 4, [False]),
        ([], 2, []),
    ],
)
def test_a_group_is_kept_where_its_values_differ(values, n, kept):
    assert kept_groups(values, n) == kept


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_rule_is_verl_recipe_rule_on_random_values(n):
    rng = np.random.default_rng(n)
    for _ in range(50):
        groups = int(rng.integers(1, 9))
        values = rng.choice([0.0, 0.5, 1.0], size=groups * n).tolist()  # few levels, so whole groups often agree
        uids = [f"p{i // n}" for i in range(groups * n)]
        ours = [f"p{g}" for g, k in enumerate(kept_groups(values, n)) if k]
        assert ours == verl_recipe_kept(uids, values)


@pytest.mark.parametrize(
    "metric, want",
    [
        ("reward", [0.5, -1.0]),
        ("seq_reward", [0.5, -1.0]),
        ("seq_final_reward", [0.5, -1.0]),
        ("acc", [1.0, 0.0]),
        ("score", [None, 0.0]),  # the first sample's function returned a number: only acc
        ("pred", [None, "7"]),
    ],
)
def test_each_sample_value_comes_from_its_score_or_its_reward_fields(metric, want):
    fields = [{"acc": 1.0}, {"score": 0.0, "acc": 0.0, "pred": "7"}]
    assert sample_values(metric, [0.5, -1.0], fields) == want


class Letters:
    """A tokenizer that decodes token i as the letter chr(96 + i)."""

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["".join(chr(96 + t) for t in row if t) for row in ids]


@pytest.mark.parametrize(
    "result, fields",
    [
        (0.75, [{"acc": 0.75}] * 2),  # a number: acc, before the overlong penalty (verl 0.9's reward loop)
        ({"score": 0.75, "pred": "x"}, [{"score": 0.75, "pred": "x"}] * 2),  # a dict: its own keys
    ],
)
def test_the_fields_a_reward_function_returns_reach_the_filter_as_verl_records_them(result, fields):
    ro = pack_responses([[1]], 2, [[2, 3, 4], [2]], None, 3, 0, 9)
    src = RewardSource(lambda *a: result, None, None, "prompt", Overlong(1, 1.0, 2))
    rows = [{"data_source": "d", "reward_model": {"ground_truth": "g"}}]
    batch, got = score_batch_with_fields(Letters(), src, rows, StepBatch.from_rollout(ro, 2), 2)
    assert got == fields
    assert batch.scores.tolist() == pytest.approx([0.75 - 2.0, 0.75])  # the penalty is in the score, not in acc
    assert torch.equal(batch.token_scores.sum(-1), batch.scores)
    assert score(Letters(), src, rows, ro, 2)[2] == ([{}] * 2 if not isinstance(result, dict) else fields)


GOLDEN = json.loads(pathlib.Path(__file__).with_name("verl_filter_groups_golden.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["cases"]["dapo_filtered_keys"])
def test_the_groups_dropped_are_verl_own_filter_ones(case):
    """verl 0.9.1's ReplayBuffer._dapo_filtered_keys, recorded by verl_filter_groups_golden.py."""
    scores = case["values"] if case["metric"] == "reward" else [0.0] * len(case["values"])
    values = sample_values(case["metric"], scores, [{"acc": v} for v in case["values"]])
    kept = kept_groups(values, case["n"])
    assert [g for g, k in enumerate(kept) if not k] == case["dropped"]
