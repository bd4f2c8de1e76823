"""An agent written with the `openai` package drives a real run (rlrig train --preset openai-agent, the hf engine):
it learns to call its calculator; agents that raise or hang end their samples only, counted, and the run goes on.
CI checks the same through the hf engine in-process (tests/unit/trainer/agent/test_openai_agent.py); these are the
whole runs, long ones."""

from pathlib import Path

import pytest

from tests.integration.test_train import metrics, rlrig

pytestmark = [pytest.mark.integration, pytest.mark.long]


def openai_agent(run: Path, *extra: str, steps: int) -> list[dict]:
    r = rlrig(
        "train",
        "--preset",
        "openai-agent",
        "actor_rollout_ref.rollout.name=hf",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={run}",
        *extra,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return metrics(run)


def test_the_openai_agent_learns_to_call_its_calculator(tmp_path):
    rows = openai_agent(tmp_path / "run", steps=40)
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    assert last > first + 0.2, (first, last)  # measured: 0.61 to 0.97 (docs/trainer/multi-turn.md)
    turns = [r["num_turns/mean"] for r in rows if "num_turns/mean" in r]
    assert turns[-1] > turns[0]  # more samples call the calculator (4 turns) than at the start
    val = [r["val-core/rlrig/calculator/reward/mean@1"] for r in rows if "val-core/rlrig/calculator/reward/mean@1" in r]
    assert val[-1] > val[0], val
    assert all(r["agent/openai/failed"] == r["agent/openai/timed_out"] == 0 for r in rows if "agent/openai/failed" in r)


FLAKY = """
import time

import openai

from rlrig.trainer.agent.openai_demo import solve


def agent(base_url, api_key, row):
    how = row["extra_info"]["index"] % 3
    if how in (1, 2):
        openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
            model="m", messages=row["messages"]
        )
        if how == 2:
            time.sleep(600)
        raise RuntimeError("the agent's own bug")
    return solve(base_url, api_key, row)
"""


def test_agents_that_raise_or_hang_end_their_samples_only(tmp_path):
    (tmp_path / "flaky.py").write_text(FLAKY)
    (tmp_path / "loops.yaml").write_text(
        "- name: calculator_agent\n  _target_: rlrig.trainer.agent.openai_agent.OpenAIAgentLoop\n"
        f"  agent: {tmp_path / 'flaky.py'}:agent\n  timeout_s: 5\n"
    )
    rows = openai_agent(
        tmp_path / "run",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={tmp_path / 'loops.yaml'}",
        steps=2,
    )
    steps = [r for r in rows if "agent/openai/failed" in r]
    assert len(steps) == 2
    for r in steps:  # each step's 16 prompts x 8 samples: about two thirds of them raise or hang
        assert r["agent/openai/failed"] > 0 and r["agent/openai/timed_out"] > 0, r
        assert r["agent/openai/failed"] + r["agent/openai/timed_out"] < 128
        assert r["critic/score/max"] == 1.0  # the others were scored


def test_the_openai_agent_runs_on_a_rollout_pool_of_its_own(tmp_path):
    """The endpoint in the rollout workers, one step off-policy: the samples and their outcome counts reach the
    trainer."""
    rows = openai_agent(
        tmp_path / "run",
        "actor_rollout_ref.hybrid_engine=False",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        "trainer.n_gpus_per_node=1",
        "trainer.async_mode=one_step_off_policy",
        steps=3,
    )
    steps = [r for r in rows if "agent/openai/failed" in r]
    assert [r["training/global_step"] for r in steps] == [1, 2, 3]
    assert all(
        r["agent/openai/failed"] == r["agent/openai/timed_out"] == r["agent/openai/over_budget"] == 0 for r in steps
    )
    assert all(
        0 < r["critic/score/mean"] < 1 and r["num_turns/mean"] > 2 for r in steps
    )  # measured: 0.45-0.56, 2.9-3.1
