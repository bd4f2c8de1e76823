"""Padding-free forwards (model.use_remove_padding) give the padded forwards' numbers."""

import pytest
import torch

from rlrig.trainer.model import packing


@pytest.mark.parametrize(
    "lengths,width,rows,starts,used",
    [
        ([3, 5, 2], 5, [1, 0, 1], [0, 0, 3], [5, 5]),  # longest first; 2 fits after 3
        ([1, 1, 1, 1], 2, [0, 0, 1, 1], [0, 1, 0, 1], [2, 2]),
        ([4], 4, [0], [0], [4]),
    ],
)
def test_first_fit(lengths, width, rows, starts, used):
    assert packing.first_fit(lengths, width) == (rows, starts, used)


def test_packed_layout_by_hand():
    # prompt_len 2, width 5: row 0 is prompt 5, response 6 7; row 1 is prompt 1 2, response 3 4 9
    ids = torch.tensor([[0, 5, 6, 7, 0], [1, 2, 3, 4, 9]])
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    pk = packing.pack(ids, mask, prompt_len=2, pad_id=0)
    # the 5-token sequence fills row 0; the 3-token one goes to row 1, followed by a 2-token tail
    assert pk.input_ids.tolist() == [[1, 2, 3, 4, 9], [5, 6, 7, 0, 0]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    # response tokens: row 0's 6 (col 2) and 7 (col 3) sit at flat 6, 7; row 1's 3 4 9 at 2, 3, 4
    assert pk.at.tolist() == [6, 7, 2, 3, 4]
    assert pk.filled.tolist() == [[True, True, False], [True, True, True]]
    assert packing.unpack(torch.tensor([1.0, 2, 3, 4, 5]), pk.filled).tolist() == [[1, 2, 0], [3, 4, 5]]


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    path = ensure_tiny_model()
    torch.manual_seed(0)
    return (
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32),
    )


def batch(vocab, prompt_lens, response_lens, P=6, R=7):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (len(prompt_lens), P + R), generator=g)
    mask = torch.ones_like(ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        mask[i, : P - p] = 0
        mask[i, P + r :] = 0
    return ids.masked_fill(mask == 0, 0), mask, P


@pytest.mark.parametrize(
    "prompt_lens,response_lens",
    [
        ([6, 4, 2, 5, 6], [7, 3, 0, 5, 1]),  # ragged both ways, one empty response
        ([6, 6], [7, 7]),  # nothing to remove
        ([1], [2]),
    ],
)
def test_packed_logprobs_entropy_and_values_match_padded(tiny, prompt_lens, response_lens):
    from rlrig.trainer.model.forward import ForwardOptions, token_logprobs
    from rlrig.trainer.model.forward import values as critic_values

    actor, critic = tiny
    ids, mask, P = batch(actor.config.vocab_size, prompt_lens, response_lens)
    filled = mask[:, P:].bool()
    padded = token_logprobs(actor, ids, mask, P, ForwardOptions(with_entropy=True))
    packed = token_logprobs(actor, ids, mask, P, ForwardOptions(with_entropy=True, remove_padding=True))
    for a, b in zip(padded, packed):
        torch.testing.assert_close(b[filled], a[filled], atol=1e-5, rtol=1e-5)
        assert (b[~filled] == 0).all()
    # gradients reach the model through the packed path
    actor.zero_grad()
    packed[0].sum().backward()
    assert actor.model.embed_tokens.weight.grad.abs().sum() > 0

    with torch.no_grad():
        values = {flag: critic_values(critic, ids, mask, P, flag) for flag in (False, True)}
    torch.testing.assert_close(values[True][filled], values[False][filled], atol=1e-5, rtol=1e-5)


def test_the_packed_forward_reaches_the_vocabulary_only_at_response_positions(tiny):
    from rlrig.trainer.model.forward import ForwardOptions, token_logprobs

    actor, _ = tiny
    ids, mask, P = batch(actor.config.vocab_size, [6, 4, 2, 5, 6], [7, 3, 0, 5, 1])
    rows = []
    handle = actor.get_output_embeddings().register_forward_hook(lambda m, args, out: rows.append(out.shape[:-1]))
    try:
        token_logprobs(actor, ids, mask, P, ForwardOptions(with_entropy=True, remove_padding=True))
    finally:
        handle.remove()
    assert [tuple(r) for r in rows] == [(1, int(mask[:, P:].sum()))]  # the 16 response tokens, not the packed rows


def _flash_contract(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """transformers' flash-attention path on the CPU ([B, H, S, D] in, [B, S, H, D] out, no mask): given
    cu_seq_lens_q, each sequence of the rows laid end to end attends causally within itself; without them, each row
    attends causally over all of itself, as flash does for a batch of several rows (its _is_packed_sequence needs
    one row)."""
    from transformers.integrations.sdpa_attention import repeat_kv

    b, h, s, d = query.shape
    k, v = (repeat_kv(t, module.num_key_value_groups) for t in (key, value))
    q, k, v = (t.transpose(0, 1).reshape(h, b * s, d) for t in (query, k, v))
    cu = kwargs.get("cu_seq_lens_q")
    bounds = zip(cu[:-1].tolist(), cu[1:].tolist()) if cu is not None else ((r * s, r * s + s) for r in range(b))
    out = torch.zeros_like(q)
    for lo, hi in bounds:
        out[:, lo:hi] = torch.nn.functional.scaled_dot_product_attention(
            q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], is_causal=True, scale=scaling
        )
    return out.reshape(h, b, s, d).permute(1, 2, 0, 3), None


@pytest.mark.parametrize("impl", packing.FLASH)
def test_packed_rows_under_flash_attention_keep_each_sequence_to_itself(tiny, impl, monkeypatch):
    """Several packed rows through a flash-attention implementation: each sequence's bounds reach it (transformers
    would otherwise attend across the sequences of a row), so the log-probs and values equal the padded sdpa ones."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rlrig.trainer.model.forward import ForwardOptions, token_logprobs
    from rlrig.trainer.model.forward import values as critic_values

    actor, critic = tiny
    ids, mask, P = batch(actor.config.vocab_size, [6, 4, 2, 5, 6], [7, 3, 0, 5, 1])
    filled = mask[:, P:].bool()
    assert packing.pack(ids, mask, P).input_ids.shape[0] > 1  # several rows: the case flash gets wrong alone
    with torch.no_grad():
        padded = token_logprobs(actor, ids, mask, P, ForwardOptions())[0]
        value = critic_values(critic, ids, mask, P)
    seen = []
    monkeypatch.setitem(
        ALL_ATTENTION_FUNCTIONS._local_mapping, impl, lambda *a, **kw: seen.append(kw) or _flash_contract(*a, **kw)
    )
    for model in (actor, critic):
        monkeypatch.setattr(model.config, "_attn_implementation", impl)
    with torch.no_grad():
        packed = token_logprobs(actor, ids, mask, P, ForwardOptions(remove_padding=True))[0]
        packed_value = critic_values(critic, ids, mask, P, True)
    assert seen and all("cu_seq_lens_q" in kw for kw in seen)
    torch.testing.assert_close(packed[filled], padded[filled], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed_value[filled], value[filled], atol=1e-5, rtol=1e-5)
