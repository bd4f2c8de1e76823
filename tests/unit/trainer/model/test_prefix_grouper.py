"""actor_rollout_ref.actor.use_prefix_grouper: log-probs, entropies and gradients of the padded forward,
each distinct prompt computed once (tokens counted at the embedding), with and without gradient checkpointing."""

import pytest
import torch

from rlrig.trainer.model import prefix_grouper
from rlrig.trainer.model.build import set_checkpointing
from rlrig.trainer.model.forward import ForwardOptions, token_logprobs
from tests.helpers.model_hooks import embedded_tokens


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)


def rollout(prompts, n, response_lens, R, vocab):
    """Left-padded prompts, each repeated n times, then right-padded responses of the given lengths."""
    g = torch.Generator().manual_seed(1)
    P = max(map(len, prompts))
    rows = [p for p in prompts for _ in range(n)]
    ids = torch.zeros(len(rows), P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(rows, response_lens)):
        ids[i, P - len(p) : P], mask[i, P - len(p) : P] = torch.tensor(p), 1
        ids[i, P : P + r], mask[i, P : P + r] = torch.randint(3, vocab, (r,), generator=g), 1
    return ids, mask, P


def _grads(model, logp, mask):
    model.zero_grad()
    (logp * mask).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


CASES = [
    # prompts, samples each, response lengths (one per sample), response width
    ([[5, 6, 7, 8], [9, 10, 11, 12]], 3, [6, 2, 6, 1, 6, 4], 6),  # no padding, ragged responses
    (
        [[5, 6, 7, 8, 9], [11], [12, 13, 14]],
        2,
        [5, 5, 3, 0, 5, 1],
        5,
    ),  # left padding, a one-token prompt, an empty response
    (
        [[5, 6, 7], [5, 6, 7], [8, 9]],
        2,
        [4, 4, 4, 4, 2, 3],
        4,
    ),  # a prompt drawn twice: one computation for all four samples
    ([[5, 6, 7], [8, 9]], 4, [1] * 8, 1),  # one response token: the prompts' forward alone
]


@pytest.mark.parametrize("prompts,n,response_lens,R", CASES)
@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_prompts_give_the_padded_numbers_from_fewer_tokens(model, prompts, n, response_lens, R, checkpointing):
    ids, mask, P = rollout(prompts, n, response_lens, R, model.config.vocab_size)
    resp_mask = mask[:, P:].float()
    if checkpointing:
        set_checkpointing(model, True)
    model.train()
    seen, remove = embedded_tokens(model)
    try:
        outs, tokens, grads = {}, {}, {}
        for shared in (False, True):
            seen[0] = 0
            outs[shared] = token_logprobs(model, ids, mask, P, ForwardOptions(with_entropy=True, share_prompts=shared))
            tokens[shared] = seen[0]
            grads[shared] = _grads(model, outs[shared][0] + outs[shared][1], resp_mask)
    finally:
        remove()
        set_checkpointing(model, False)
        model.eval()
    filled = resp_mask.bool()
    for plain, fast in zip(outs[False], outs[True]):
        torch.testing.assert_close(fast[filled], plain[filled], atol=1e-5, rtol=1e-5)
    for plain, fast in zip(grads[False], grads[True]):
        torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-4)
    distinct = len({tuple(p) for p in prompts})
    # the forward pass (not the recompute: the embedding is outside the checkpointed layers) of the padded
    # layout sees every sample's P + R - 1 positions; shared, each distinct prompt's P once and each response's R - 1
    assert tokens[False] == len(ids) * (P + R - 1)
    assert tokens[True] == distinct * P + len(ids) * (R - 1)


def test_checkpointing_recomputes_the_shared_forwards(model):
    """With checkpointing on, the backward pass recomputes both forwards' layers from the caches they kept."""
    ids, mask, P = rollout(*CASES[1][:2], CASES[1][2], CASES[1][3], model.config.vocab_size)
    calls = [0]
    handle = model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    counts = []
    model.train()
    try:
        for on in (False, True):
            if on:
                set_checkpointing(model, True)
            calls[0] = 0
            token_logprobs(model, ids, mask, P, ForwardOptions(share_prompts=True))[0].sum().backward()
            counts.append(calls[0])
    finally:
        handle.remove()
        set_checkpointing(model, False)
        model.eval()
        model.zero_grad()
    assert counts == [2, 4]  # prompts' forward and responses' forward, each once more in the backward pass


def test_models_without_plain_key_value_layers_are_refused_in_one_line():
    from transformers import Qwen2Config, Qwen3NextConfig

    assert prefix_grouper.refusal(Qwen2Config(num_hidden_layers=2)) is None
    sliding = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    hybrid = Qwen3NextConfig(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    for conf, kind in ((sliding, "DynamicSlidingWindowLayer"), (hybrid, "LinearAttention")):
        why = prefix_grouper.refusal(conf)
        assert why and "\n" not in why and kind in why and "use_prefix_grouper=True" in why and "set it False" in why
