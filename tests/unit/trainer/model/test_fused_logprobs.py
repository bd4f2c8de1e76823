"""The fused head (actor_rollout_ref.model.use_fused_kernels, model/fused_logprobs.py) gives the chunked path's
log-probs, entropy and gradients without making the logits: on its own, and in a tiny model's padded and packed
forwards; and what it cannot stand in for is refused in one line."""

import pytest
import torch

from rlrig.trainer.model import chunked_logprobs as C
from rlrig.trainer.model.forward import ForwardOptions, fused_head_refusal, token_logprobs
from rlrig.trainer.model.fused_logprobs import fused_logprobs_and_entropy

V, H = 50, 16


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 9, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) / 2).to(dtype)
    targets = torch.randint(0, V, (3, 9), generator=g)
    return hidden, weight, targets, torch.randn(3, 9, generator=g), torch.randn(3, 9, generator=g)


def _run(fn, hidden, weight, w_logp, w_ent):
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logp, ent = fn(h, w)
    loss = (logp * w_logp).sum() + ((ent * w_ent).sum() if ent is not None and ent.requires_grad else 0.0)
    loss.backward()
    return logp.detach(), None if ent is None else ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chunks_run_the_chosen_math_and_its_traced_form_gives_the_eager_values(monkeypatch, dtype):
    """model.use_fused_kernels with use_torch_compile: the fused head's chunks go through the process's math (it ran
    its own eager fp32 passes before, whatever was compiled), and the traced math gives the eager numbers."""
    from rlrig.trainer.model import compiled

    monkeypatch.setattr(C, "CHUNK_ELEMENTS", 7 * V)
    torch._dynamo.reset()
    hidden, weight, targets, w_logp, w_ent = _inputs(dtype)

    def run(math):
        fused = lambda h, w: fused_logprobs_and_entropy(h, w, targets, 0.7, True, True, math=math)  # noqa: E731
        return _run(fused, hidden, weight, w_logp, w_ent)

    calls = []
    counted = C.ChunkMath(
        forward=lambda *a: calls.append("forward") or C.logits_forward(*a),
        grad=lambda *a: calls.append("grad") or C.logits_grad(*a),
    )
    monkeypatch.setattr(C, "_chosen", counted)
    want = run(None)
    assert calls == ["forward"] * 4 + ["grad"] * 4  # 27 tokens, 7 a chunk
    got = run(compiled.compiled_math("aot_eager"))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_elements", [7 * V, 2**25])  # 7 tokens a chunk (uneven tail), or all at once
@pytest.mark.parametrize("with_entropy,entropy_grad", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equals_the_chunked_path_on_the_heads_logits(
    monkeypatch, dtype, chunk_elements, with_entropy, entropy_grad, temperature
):
    monkeypatch.setattr(C, "CHUNK_ELEMENTS", chunk_elements)
    hidden, weight, targets, w_logp, w_ent = _inputs(dtype)
    got = _run(
        lambda h, w: fused_logprobs_and_entropy(h, w, targets, temperature, with_entropy, entropy_grad),
        hidden,
        weight,
        w_logp,
        w_ent,
    )
    want = _run(
        lambda h, w: C.token_logprobs_and_entropy(h @ w.T, targets, with_entropy, entropy_grad, temperature),
        hidden,
        weight,
        w_logp,
        w_ent,
    )
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        assert a.dtype == b.dtype  # fp32 log-probs and entropy; gradients in the inputs' dtypes
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_under_autocast_the_logits_are_the_plain_heads_and_the_weight_grad_its_dtype():
    # DDP's mixed precision: fp32 weights, bf16 products under autocast; the fused head computes as the plain one
    hidden, weight, targets, w_logp, _ = _inputs(torch.float32)
    outs = []
    for fused in (True, False):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fused:
                logp, _ = fused_logprobs_and_entropy(h, w, targets)
            else:
                logp, _ = C.token_logprobs_and_entropy(torch.nn.functional.linear(h, w), targets)
        (logp * w_logp).sum().backward()
        outs.append((logp.detach(), h.grad, w.grad))
    for a, b in zip(*outs):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)
    # the products ran in bf16 (fp32 ones would differ from the plain head's by far less than bf16's rounding)
    exact = C.token_logprobs_and_entropy(hidden @ weight.T, targets)[0]
    assert (outs[0][0] - exact).abs().max() > 1e-4


def test_no_tensor_of_the_logits_size_is_kept_for_backward(monkeypatch):
    monkeypatch.setattr(C, "CHUNK_ELEMENTS", 8 * 1000)
    hidden = torch.randn(64, 32, requires_grad=True)
    weight = torch.randn(1000, 32, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        fused_logprobs_and_entropy(hidden, weight, targets, with_entropy=True)
    assert max(t.numel() for t in saved) == weight.numel()  # the weight itself, the hidden states, per-token vectors


def test_one_target_per_hidden_state():
    with pytest.raises(ValueError, match="one target per hidden state"):
        fused_logprobs_and_entropy(torch.randn(4, H), torch.randn(V, H), torch.zeros(5, dtype=torch.long))


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    return AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)


def _batch(vocab, P=6, R=7):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (4, P + R), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a shorter prompt
    mask[1, P + 3 :] = 0  # a shorter response
    mask[2, P:] = 0  # no response
    return ids * mask, mask, P


@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_a_models_fused_pass_equals_its_chunked_pass(tiny, remove_padding, temperature, with_entropy):
    ids, mask, P = _batch(tiny.config.vocab_size)
    outs = {}
    for fused in (False, True):
        tiny.zero_grad()
        opts = ForwardOptions(remove_padding, temperature=temperature, with_entropy=with_entropy, fused_head=fused)
        logp, ent = token_logprobs(tiny, ids, mask, P, opts)
        loss = (logp * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)).sum()
        (loss - 0.1 * ent.sum() if with_entropy else loss).backward()
        grads = {n: p.grad.clone() for n, p in tiny.named_parameters()}
        outs[fused] = (logp.detach(), None if ent is None else ent.detach(), grads)
    (a_logp, a_ent, a_grads), (b_logp, b_ent, b_grads) = outs[False], outs[True]
    torch.testing.assert_close(b_logp, a_logp, atol=1e-5, rtol=1e-5)
    if with_entropy:
        torch.testing.assert_close(b_ent, a_ent, atol=1e-5, rtol=1e-5)
    else:
        assert a_ent is None and b_ent is None
    for name, g in a_grads.items():
        torch.testing.assert_close(b_grads[name], g, atol=1e-5, rtol=1e-4, msg=name)
    assert tiny.get_output_embeddings().weight.grad.abs().sum() > 0  # the fused run's, through the head (tied)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_the_fused_pass_never_makes_the_logits(tiny, remove_padding):
    ids, mask, P = _batch(tiny.config.vocab_size)
    widths = []
    hook = tiny.get_output_embeddings().register_forward_hook(lambda m, args, out: widths.append(out.shape[-1]))
    try:
        token_logprobs(tiny, ids, mask, P, ForwardOptions(remove_padding, with_entropy=True, fused_head=True))
    finally:
        hook.remove()
    assert widths == [2]  # the head returned (log p, entropy) per position, not the vocabulary's logits
    assert "forward" not in tiny.get_output_embeddings().__dict__  # the head's own forward is back


def _tiny_config(**extra):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        **extra,
    )


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    conf = Gemma2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    return Gemma2ForCausalLM(conf)


def _lora_on_the_head():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    return get_peft_model(Qwen2ForCausalLM(_tiny_config()), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))


def _lora_all_linear():
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    return get_peft_model(Qwen2ForCausalLM(_tiny_config()), LoraConfig(r=2, target_modules="all-linear"))


def _head_with_bias():
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM(_tiny_config(tie_word_embeddings=False))
    model.lm_head = torch.nn.Linear(32, 40, bias=True)
    return model


@pytest.mark.parametrize(
    "make, refused",
    [
        (lambda: __import__("transformers").Qwen2ForCausalLM(_tiny_config()), None),
        (_lora_all_linear, None),  # peft's all-linear leaves the output layer alone
        (_gemma2, "gemma2's final_logit_softcapping=30.0 transforms the head's logits, which a fused head never makes"),
        (
            _lora_on_the_head,
            "the model's output head is peft.tuners.lora.layer.Linear, not a plain torch.nn.Linear",
        ),
        (_head_with_bias, "the model's output head has a bias"),
    ],
)
def test_heads_the_fused_head_cannot_stand_in_for(make, refused):
    assert fused_head_refusal(make()) == refused


def test_a_forward_that_transforms_the_heads_output_is_refused_in_one_line(tiny):
    # a model whose forward scales what its head returns, beyond what the start-up check knows of
    from transformers import Qwen2ForCausalLM

    class Scaled(Qwen2ForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 0.5
            return out

    model = Scaled(_tiny_config())
    ids, mask, P = _batch(40)
    with pytest.raises(ValueError) as e:
        token_logprobs(model, ids, mask, P, ForwardOptions(fused_head=True))
    assert "the model's forward changes what its output head returns" in str(e.value) and "\n" not in str(e.value)
    assert "forward" not in model.get_output_embeddings().__dict__


def test_no_sum_pi_squared_and_no_shared_prompts_from_a_fused_head(tiny):
    ids, mask, P = _batch(tiny.config.vocab_size)
    for opts in (
        ForwardOptions(fused_head=True, with_sum_pi_squared=True),
        ForwardOptions(fused_head=True, share_prompts=True),
    ):
        with pytest.raises(ValueError, match="a fused head makes no logits"):
            token_logprobs(tiny, ids, mask, P, opts)


def test_a_model_that_ignores_logits_to_keep_gets_the_response_positions(tiny):
    from transformers import Qwen2ForCausalLM

    class AllPositions(Qwen2ForCausalLM):
        def forward(self, *args, logits_to_keep=0, **kwargs):
            return super().forward(*args, **kwargs)

    model = AllPositions(_tiny_config())
    ids, mask, P = _batch(40)
    opts = ForwardOptions(temperature=0.7, with_entropy=True)
    want = token_logprobs(model, ids, mask, P, opts)
    got = token_logprobs(model, ids, mask, P, ForwardOptions(temperature=0.7, with_entropy=True, fused_head=True))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
