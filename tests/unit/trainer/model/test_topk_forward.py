"""The top-k distillation forwards (model/forward.py token_logprobs_at, topk_token_logprobs): padded and packed
(model.use_remove_padding) rows give the same numbers, equal to log_softmax over the model's logits, 0 on padding."""

import pytest
import torch

from rlrig.trainer.model.forward import ForwardOptions, token_logprobs_at, topk_token_logprobs


@pytest.fixture(scope="module")
def batch():
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32).eval()
    # left-padded prompts (4 columns), right-padded responses (4 columns)
    ids = torch.randint(3, 20, (3, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[1, 6:] = 0
    mask[2, :1] = 0
    mask[2, 7:] = 0
    return model, ids, mask


def reference(model, ids, mask, temperature=1.0):
    """Each sequence alone, unpadded: log_softmax at its response positions, [B, 4, V] (zero where padded)."""
    out = torch.zeros(len(ids), 4, model.config.vocab_size)
    for i in range(len(ids)):
        keep = mask[i].bool()
        with torch.no_grad():
            logits = model(ids[i][keep][None]).logits[0].float() / temperature
        prompt = int(keep[:4].sum())
        resp = int(keep[4:].sum())
        out[i, :resp] = torch.log_softmax(logits[prompt - 1 : prompt - 1 + resp], -1)
    return out


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_teachers_top_k_is_its_log_softmax_top_k(batch, packed):
    model, ids, mask = batch
    logp, top = topk_token_logprobs(model, ids, mask, 4, ForwardOptions(remove_padding=packed), 3)
    want = reference(model, ids, mask).topk(3, dim=-1)
    filled = mask[:, 4:].bool()
    torch.testing.assert_close(logp[filled], want.values[filled], atol=1e-5, rtol=1e-5)
    assert torch.equal(top[filled], want.indices[filled])
    assert (logp[~filled] == 0).all() and (top[~filled] == 0).all()


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_students_log_probs_at_given_tokens_have_their_gradient(batch, packed):
    model, ids, mask = batch
    at = torch.randint(0, model.config.vocab_size, (3, 4, 2), generator=torch.Generator().manual_seed(1))
    opts = ForwardOptions(remove_padding=packed, temperature=0.7)
    logp, ent, at_logp, own = token_logprobs_at(model, ids, mask, 4, opts, at)
    want = reference(model, ids, mask, temperature=0.7)
    filled = mask[:, 4:].bool()
    torch.testing.assert_close(at_logp[filled], want.gather(-1, at)[filled], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logp[filled], want.gather(-1, ids[:, 4:, None])[..., 0][filled], atol=1e-5, rtol=1e-5)
    assert torch.equal(own[filled], want.topk(2, dim=-1).indices[filled]) and ent is None
    model.zero_grad()
    at_logp[filled].sum().backward()
    assert model.get_output_embeddings().weight.grad.abs().sum() > 0
