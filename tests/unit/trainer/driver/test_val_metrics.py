"""verl's validation metrics (trainer/val_metrics.py): by hand where they are plain statistics, against verl's own
way of drawing the bootstrap samples where they are not."""

import numpy as np
import pytest

from rlrig.trainer.driver.val_metrics import majority, subset_sizes, validation_metrics
from rlrig.trainer.errors import ConfigError


def verl_bootstrap(data, k, fn):
    # verl's bootstrap_metric, as it is written there: the global generator seeded with 42, then one choice call
    np.random.seed(42)
    idx = np.random.choice(len(data), size=(1000, k), replace=True)
    arr = np.array(data, dtype=object)
    vals = [fn(arr[row]) for row in idx]
    return float(np.mean(vals)), float(np.std(vals))


def test_one_sample_a_prompt_is_the_mean_alone():
    m = validation_metrics([("src", [{"reward": 1.0}]), ("src", [{"reward": 0.0}]), ("other", [{"reward": 0.5}])])
    assert m == {"val-core/src/reward/mean@1": 0.5, "val-core/other/reward/mean@1": 0.5}


def test_several_samples_plain_statistics_by_hand():
    # two prompts of 2 samples: [1, 0] and [1, 1] -> mean@2 (0.5 + 1) / 2, std@2 (0.5 + 0) / 2
    m = validation_metrics([("s", [{"reward": 1.0}, {"reward": 0.0}]), ("s", [{"reward": 1.0}, {"reward": 1.0}])])
    assert m["val-core/s/reward/mean@2"] == 0.75 and m["val-aux/s/reward/std@2"] == 0.25
    # [1, 1] bootstraps to 1 always; [1, 0] as verl's draws give
    best, best_std = verl_bootstrap([1.0, 0.0], 2, np.max)
    worst, _ = verl_bootstrap([1.0, 0.0], 2, np.min)
    assert m["val-core/s/reward/best@2/mean"] == pytest.approx((best + 1.0) / 2)
    assert m["val-core/s/reward/best@2/std"] == pytest.approx(best_std / 2)  # verl files it under val-core too
    assert m["val-aux/s/reward/worst@2/mean"] == pytest.approx((worst + 1.0) / 2)
    assert 0.7 < best < 0.8  # 1 unless both draws are the 0: about 3/4


@pytest.mark.parametrize("n, sizes", [(1, []), (2, [2]), (3, [2, 3]), (4, [2, 4]), (5, [2, 4, 5]), (16, [2, 4, 8, 16])])
def test_subset_sizes(n, sizes):
    assert subset_sizes(n) == sizes


def test_majority_as_verls_example():
    votes = [{"pred": "A", "val": 0.9}, {"pred": "B", "val": 0.8}, {"pred": "A", "val": 0.7}]
    assert majority(votes) == 0.9
    assert majority([{"pred": "B", "val": 0.1}, {"pred": "A", "val": 0.2}]) == 0.1  # a tie: the pred seen first


def test_returned_fields_become_variables_acc_is_core_and_pred_votes():
    samples = [
        {"reward": 1.0, "acc": True, "pred": "7"},
        {"reward": 0.0, "acc": False, "pred": "8"},
        {"reward": 1.0, "acc": True, "pred": "7"},
        {"reward": 1.0, "acc": True, "pred": "7"},
    ]
    m = validation_metrics([("gsm8k", samples)])
    assert m["val-core/gsm8k/acc/mean@4"] == 0.75 and m["val-aux/gsm8k/reward/mean@4"] == 0.75
    assert {
        "val-core/gsm8k/acc/maj@4/mean",
        "val-core/gsm8k/acc/best@4/mean",
        "val-aux/gsm8k/acc/maj@2/mean",
        "val-aux/gsm8k/reward/maj@4/mean",
        "val-aux/gsm8k/acc/worst@4/mean",
    } <= set(m)
    assert not any("/pred/" in k for k in m)  # a string variable votes, it is not averaged
    votes = [{"val": s["acc"], "pred": s["pred"]} for s in samples]
    assert m["val-core/gsm8k/acc/maj@4/mean"] == pytest.approx(verl_bootstrap(votes, 4, majority)[0])


def test_fields_that_differ_between_samples_are_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        validation_metrics([("s", [{"reward": 1.0, "acc": 1.0}, {"reward": 0.0}])])
    assert "return the same fields for every sample" in str(e.value) and "\n" not in str(e.value)
