"""Partial rollouts (the fully async mode's async_training.partial_rollout): a generation stopped at a token boundary
and gone on with later is the generation it would have been, token for token and log-prob for log-prob, when the
weights did not change in between (greedy decoding makes that exact)."""

import pytest
import torch

from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.model.forward import ForwardOptions, token_outputs
from rlrig.trainer.rollout import engines
from rlrig.trainer.rollout.engines import hf_engine
from rlrig.trainer.rollout.partial import Partial, go_on, packed

MAX_NEW = 6
PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    cfg = RolloutConfig(do_sample=False)  # greedy: the same weights draw the same tokens, interrupted or not
    engine = hf_engine.HFRollout(engines.EngineContext(model, tok, cfg, 16, MAX_NEW, "/m", "cpu", 0))
    return model, tok, engine


def stop_after(tokens: int):
    """A stopped() that halts the generation once `tokens` tokens are drawn (transformers asks after each one)."""
    asked = [0]

    def stopped():
        asked[0] += 1
        return asked[0] >= tokens

    return stopped


def logprobs(model):
    def of(ro):
        with torch.no_grad():
            logp, _, _ = token_outputs(
                model, ro.input_ids, ro.attention_mask, ro.prompt_len, ForwardOptions(temperature=1.0)
            )
        return logp.float() * ro.response_mask

    return of


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_an_interrupted_generation_goes_on_to_the_one_it_would_have_been(tiny, cut):
    model, tok, engine = tiny
    eos = tok.eos_token_id
    whole = [Partial.fresh(i, p, 2) for i, p in enumerate(PROMPTS)]
    go_on(engine, whole, MAX_NEW, lambda: False, logprobs(model), version=0)
    assert all(it.finished for it in whole)

    parts = [Partial.fresh(i, p, 2) for i, p in enumerate(PROMPTS)]
    go_on(engine, parts, MAX_NEW, stop_after(cut), logprobs(model), version=0)
    # a sample the stop cut short has `cut` tokens and no EOS, and is not done; one that ended first is done
    for it, ref in zip(parts, whole):
        for k in range(2):
            assert it.tokens[k] == ref.tokens[k][: len(it.tokens[k])]
            assert it.done[k] == (len(ref.tokens[k]) <= cut)
            if not it.done[k]:
                assert len(it.tokens[k]) == cut and eos not in it.tokens[k]
    go_on(engine, [it for it in parts if not it.finished], MAX_NEW, lambda: False, logprobs(model), version=1)
    for it, ref in zip(parts, whole):
        assert it.finished and it.tokens == ref.tokens
        for got, want in zip(it.logps, ref.logps):
            assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-5)
        assert it.versions == ([0, 1] if any(len(t) > cut for t in ref.tokens) else [0])


def test_finished_partials_pack_as_their_prompts_samples_in_one_rollout(tiny):
    _, tok, _ = tiny
    it = Partial(3, [5, 6], [[7, tok.eos_token_id], [8, 9, 10]], [[-0.5, -0.25], [-1.0, -2.0, -3.0]], [True, True])
    other = Partial(4, [9], [[11], [12, tok.eos_token_id]], [[-0.1], [-0.2, -0.3]], [True, True])
    ro = packed([it, other], 4, tok.pad_token_id, tok.eos_token_id)
    # item j's samples at rows j*n..: the second's shorter prompt left-padded to the first's
    pad = tok.pad_token_id
    assert ro.prompt_len == 2 and ro.input_ids[:, :2].tolist() == [[5, 6], [5, 6], [pad, 9], [pad, 9]]
    assert ro.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]]
    want = [[-0.5, -0.25, 0.0, 0.0], [-1.0, -2.0, -3.0, 0.0], [-0.1, 0.0, 0.0, 0.0], [-0.2, -0.3, 0.0, 0.0]]
    torch.testing.assert_close(ro.engine_logp, torch.tensor(want))
