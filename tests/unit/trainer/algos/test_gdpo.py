"""GDPO against verl 0.9.1's compute_gdpo_outcome_advantage on the same random inputs (verl_gdpo_golden.json, written
by verl_gdpo_golden.py), and its components taken from the reward function's fields."""

import json
from pathlib import Path

import pytest
import torch

from rlrig.trainer.algos import estimators
from rlrig.trainer.algos.core_algos import local
from rlrig.trainer.algos.estimators.registry import AdvantageInput

GOLDEN = json.loads(Path(__file__).with_name("verl_gdpo_golden.json").read_text())
T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
# verl computes the per-component GRPO step in float32 (its reward components' dtype)
CLOSE = 1e-5


@pytest.mark.parametrize("case", GOLDEN["cases"]["gdpo"], ids=lambda c: f"k{len(c['components'][0])}")
def test_gdpo_equals_verl(case):
    assert GOLDEN["verl_release"] == "0.9.1"
    mask = T(case["mask"])
    x = AdvantageInput(
        token_rewards=torch.zeros_like(mask),  # not read: the components are
        mask=mask,
        index=case["index"],
        values=None,
        gamma=1.0,
        lam=1.0,
        norm_adv_by_std_in_grpo=case["norm_adv_by_std_in_grpo"],
        allreduce=local,
        components=T(case["components"]),
        component_weights=case["weights"],
    )
    est = estimators.get("gdpo")
    adv, returns = est.fn(x)
    torch.testing.assert_close(adv, T(case["verl"]), rtol=CLOSE, atol=CLOSE)
    torch.testing.assert_close(returns, adv)
    assert est.needs_reward_components and not est.needs_critic


REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.0, "fmt": float(len(solution_str) % 3), "acc": float(len(solution_str) % 2)}
"""


def test_gdpo_through_a_worker_normalizes_each_reward_field(tmp_path):
    """A step with adv_estimator=gdpo: the estimator gets the reward function's fields named by gdpo_reward_keys
    (in that order) and gives verl's advantages of them."""
    import dataclasses

    from rlrig.trainer.algos.estimators.gdpo import gdpo_advantages
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.workers.step.request import StepRequest

    fn = tmp_path / "reward.py"
    fn.write_text(REWARD)
    with single_worker(
        [
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "algorithm.adv_estimator=gdpo",
            "algorithm.gdpo_reward_keys=[acc,fmt]",
            "algorithm.gdpo_reward_weights=[1.0,0.5]",
            "actor_rollout_ref.rollout.n=3",
            "actor_rollout_ref.rollout.name=hf",
            f"custom_reward_function.path={fn}",
        ]
    ) as (w, batches):
        seen = {}
        real = w.context.estimate

        def estimate(x):
            seen["x"], seen["out"] = x, real(x)
            return seen["out"]

        w.context = dataclasses.replace(w.context, estimate=estimate)
        out = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
    x = seen["x"]
    assert x.components.shape == (12, 2) and x.component_weights == [1.0, 0.5]
    assert set(x.components[:, 0].tolist()) <= {0.0, 1.0} and set(x.components[:, 1].tolist()) <= {0.0, 1.0, 2.0}
    assert x.token_rewards.abs().sum() == 0  # the score is 0: what moves the policy is the fields
    expected = gdpo_advantages(x.components, x.mask, x.index, [1.0, 0.5], True)[0]
    torch.testing.assert_close(seen["out"][0], expected)
    for i, key in enumerate(("acc", "fmt")):  # verl's gdpo/<key>/* metrics: numpy's mean, std, max, min
        values = x.components[:, i].double().numpy()
        got = [out[f"gdpo/{key}/{s}"] for s in ("mean", "std", "max", "min")]
        assert got == pytest.approx([values.mean(), values.std(), values.max(), values.min()])


@pytest.mark.parametrize(
    "fields,says",
    [
        ([{"acc": 1, "fmt": 0.5}, {"acc": 0.0, "fmt": True}], None),
        ([{"acc": 1}], "'fmt' is not among the reward function's fields (acc)"),
        ([{}], "'acc' is not among the reward function's fields (none)"),
        ([{"acc": "yes", "fmt": 1}], "the reward function's field 'acc' is 'yes', not a number"),
    ],
)
def test_components_are_the_reward_fields_named(fields, says):
    from rlrig.trainer.reward.components import reward_components

    if says is None:
        assert reward_components(fields, ["acc", "fmt"], "cpu").tolist() == [[1.0, 0.5], [0.0, 1.0]]
        return
    with pytest.raises(RuntimeError) as e:
        reward_components(fields, ["acc", "fmt"], "cpu")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_component_metrics_over_workers_are_the_whole_batchs():
    """Two workers' shares: each reports the batch's mean and std; metrics.py merges them into verl's numbers."""
    import numpy as np

    from rlrig.trainer import metrics as M
    from rlrig.trainer.reward.components import component_metrics

    shares = [torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([[1.0, 1.0], [1.0, 5.0], [0.5, 0.0]])]
    summed = lambda t: sum(  # noqa: E731  (each worker's stacked sums, added as the all-reduce would)
        torch.stack([torch.full((2,), float(len(s))), s.double().sum(0), (s.double() ** 2).sum(0)]) for s in shares
    )
    merged = M.reduce([component_metrics(s, ["acc", "fmt"], summed) for s in shares])
    whole = torch.cat(shares).numpy()
    for i, key in enumerate(("acc", "fmt")):
        want = [whole[:, i].mean(), whole[:, i].std(), whole[:, i].max(), whole[:, i].min()]
        assert [merged[f"gdpo/{key}/{s}"] for s in ("mean", "std", "max", "min")] == pytest.approx(want)
    assert np.isclose(merged["gdpo/fmt/std"], np.std([0.0, 2.0, 1.0, 5.0, 0.0]))
