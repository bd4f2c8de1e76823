"""An agent loop of your own for real (rlrig train --preset two-attempts, the hf engine): the model answers, is told
whether it was right, answers again; the loop's own score rises as it learns, colocated and on a rollout pool of its
own; a loop that raises ends the run in one line naming it, with no checkpoint written."""

import os
from pathlib import Path

import pytest

from tests.integration.test_train import metrics, rlrig

pytestmark = pytest.mark.integration


def two_attempts(run: Path, *extra: str, steps: int) -> list[dict]:
    """`rlrig train --preset two-attempts` for `steps` steps (validated at the start and the end): its metrics."""
    r = rlrig(
        "train",
        "--preset",
        "two-attempts",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={run}",
        *extra,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return metrics(run)


def check_it_learned(rows: list[dict]) -> None:
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    k = len(scores) // 10
    first, last = sum(scores[:k]) / k, sum(scores[-k:]) / k
    assert last > first + 0.04, (first, last)  # measured: about 0.06 to 0.13-0.16 (docs/trainer/multi-turn.md)
    val = [r["val-core/rlrig/arithmetic/reward/mean@1"] for r in rows if "val-core/rlrig/arithmetic/reward/mean@1" in r]
    assert val[-1] > val[0], val
    assert all(r["num_turns/min"] == r["num_turns/max"] == 4 for r in rows if "num_turns/min" in r)


# long (tests/e2e/long_runs.sh): CI shows the loop learning through vLLM (tests/vllm_tier/test_vllm_own_loop.py) and
# trains it on hf in the pool tests below
@pytest.mark.long
def test_the_two_attempts_loop_learns(tmp_path):
    check_it_learned(two_attempts(tmp_path / "run", "actor_rollout_ref.rollout.name=hf", steps=100))


# fully async with partial rollouts: a sync halts the loops' generate calls in flight, which go on under the new
# weights on the worker holding the loops (agent/own_partial.py)
FULLY_ASYNC = [
    "data.train_batch_size=0",
    "async_training.require_batches=2",
    "async_training.trigger_parameter_sync_step=1",
    "async_training.staleness_threshold=1.0",
    "async_training.partial_rollout=True",
    "rollout.total_rollout_steps=96",
    # validation left out: each of the three versions would validate the whole validation set (rollout.test_freq=1)
    "trainer.val_before_train=False",
    "rollout.test_freq=0",
]


# long: one step off-policy, whose pool CI keeps in test_rollout_pool and test_multi_turn's loop
@pytest.mark.parametrize("mode", [pytest.param("one_step_off_policy", marks=pytest.mark.long), "fully_async_policy"])
def test_the_two_attempts_loop_runs_on_a_rollout_pool_of_its_own(tmp_path, mode):
    pool = ["actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.free_cache_engine=False"]
    sizes = ["rollout.nnodes=1", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"]
    rows = two_attempts(
        tmp_path / "run",
        "actor_rollout_ref.rollout.name=hf",
        *pool,
        *sizes,
        f"trainer.async_mode={mode}",
        *(FULLY_ASYNC if mode == "fully_async_policy" else []),
        steps=3,
    )
    steps = [m for m in rows if m.get("training/global_step", 0) > 0]
    assert [m["training/global_step"] for m in steps] == [1, 2, 3]
    assert all(m["num_turns/mean"] == 4 for m in steps)
    # scored by the loop (0, 1/2 or 1 a sample), which the pool's samples carried to the trainer
    assert all(0 <= m["critic/score/min"] and m["critic/score/max"] <= 1 for m in steps)
    if mode == "fully_async_policy":  # how many prompts a sync halted (tests/unit/trainer/agent/test_own_partial.py)
        print([m["fully_async/partial/total_partial_num"] for m in steps])


BROKEN = """
from rlrig.trainer.agent.verl_api import AgentLoopBase


class Broken(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        out = await self.server_manager.generate(request_id="x", prompt_ids=[1, 2], sampling_params=sampling_params)
        return {"ids": out.token_ids}["missing_key"]
"""


# long: CI checks the line in one process (tests/unit/trainer/agent/test_own_loops.py)
@pytest.mark.long
def test_a_loop_that_raises_ends_the_run_in_one_line_naming_it(tmp_path):
    (tmp_path / "broken_loop.py").write_text(BROKEN)
    (tmp_path / "loops.yaml").write_text("- name: broken\n  _target_: broken_loop.Broken\n")
    run = tmp_path / "run"
    r = rlrig(
        "train",
        "--preset",
        "two-attempts",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={tmp_path / 'loops.yaml'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=broken",
        "trainer.total_training_steps=2",
        "trainer.save_freq=1",
        "trainer.val_before_train=False",
        f"trainer.default_local_dir={run}",
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        own_cluster=True,  # the workers import the loop from PYTHONPATH, which their cluster gives them
    )
    assert r.returncode == 2
    line = f"rlrig: error: agent loop broken (broken_loop.Broken) raised KeyError: 'missing_key' at {tmp_path}"
    assert line in r.stderr, r.stderr[-3000:]
    assert not list(run.glob("global_step_*"))  # nothing saved
