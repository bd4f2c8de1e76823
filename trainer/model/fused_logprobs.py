"""Log-probs and entropy of the sampled tokens from the causal LM's final hidden states and its output head's
weight, a chunk of tokens at a time, so that the logits are never held whole (verl's
`actor_rollout_ref.model.use_fused_kernels` with `fused_kernel_options.impl_backend=torch`, its
FusedLinearForPPO): each chunk's logits z = h W^T are computed, turned into the chunk's log-probs and entropy, and
dropped; the backward pass computes them again, chunk by chunk, from the hidden states and the weight it kept.

The per-chunk math is model/chunked_logprobs.py's, the process's choice (`chunked_logprobs.chosen()`: compiled on
CUDA under `fsdp_config.use_torch_compile`, so that the compiler fuses the fp32 cast and the passes over a chunk's
logits instead of writing an fp32 copy and reading it again in each), with z = h W^T / T:

    d loss / d h = (d loss / d logits) W,        d loss / d W = sum over chunks (d loss / d logits)^T h

A chunk's logits are computed in the compute dtype (under autocast its dtype, as the plain head computes them;
otherwise the hidden states') and handed to the math as the plain head's logits are; the math computes in fp32 and
gives the gradient of the logits back in the compute dtype, before the two products, as the plain head's backward
takes it. The weight's gradient is summed over the chunks in fp32 and handed back in the weight's dtype.
"""

from __future__ import annotations

import torch

from .chunked_logprobs import ChunkMath, chosen, chunk_slice, chunk_tokens


def compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """What the plain head's matrix product computes in: autocast's dtype where it is on, else the input's."""
    kind = hidden.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype


def _add_weight_grad(acc: torch.Tensor, g: torch.Tensor, h: torch.Tensor) -> None:
    if g.dtype == acc.dtype:
        acc.addmm_(g.T, h)  # no [V, H] temporary
    else:
        acc.add_(g.T @ h)


class _FusedHeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, with_entropy: bool, dtype: torch.dtype, math):
        n, vocab = hidden.shape[0], weight.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if with_entropy else None
        step = chunk_tokens(vocab, hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):  # the casts are explicit
            w = weight.to(dtype)
            for s in range(0, n, step):
                logits = hidden[s : s + step].to(dtype) @ w.T
                logp[s : s + step], lse[s : s + step], e = math.forward(
                    logits, targets[s : s + step], temperature, with_entropy
                )
                if with_entropy:
                    ent[s : s + step] = e
        ctx.save_for_backward(hidden, weight, targets, lse, ent if with_entropy else lse)
        ctx.with_entropy, ctx.temperature, ctx.dtype, ctx.math = with_entropy, temperature, dtype, math
        ctx.set_materialize_grads(False)
        return (logp, ent) if with_entropy else (logp, lse.new_zeros(0))

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        if grad_logp is None and grad_ent is None:
            return None, None, None, None, None, None, None
        want_h, want_w = ctx.needs_input_grad[:2]
        dh = torch.empty_like(hidden) if want_h else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        step = chunk_tokens(weight.shape[0], weight.device)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(ctx.dtype)
            for s in range(0, hidden.shape[0], step):
                h = hidden[s : s + step].to(ctx.dtype)
                g = ctx.math.grad(
                    h @ w.T,
                    targets[s : s + step],
                    lse[s : s + step],
                    ent[s : s + step] if ctx.with_entropy else None,
                    chunk_slice(grad_logp, s, step),
                    chunk_slice(grad_ent, s, step),
                    ctx.temperature,
                )
                if want_h:
                    dh[s : s + step] = g @ w
                if want_w:
                    _add_weight_grad(dw, g, h)
        return dh, (dw.to(weight.dtype) if want_w else None), None, None, None, None, None


def fused_logprobs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    math: ChunkMath | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """hidden [..., H] (any float dtype: the head's input), weight [V, H] (the head's, no bias), targets [...] ->
    log p(target) [...] and the entropy [...] (None unless with_entropy), both fp32, of softmax(hidden W^T /
    temperature): model/chunked_logprobs.token_logprobs_and_entropy of the head's logits, without them. No fp32
    [chunk, V] tensor is larger than chunked_logprobs.chunk_tokens allows, forward or backward. Gradients reach `hidden`
    and `weight` (the weight's in its dtype, summed over the chunks in fp32). entropy_grad=False: the entropy is a
    metric only, with no gradient. math: the per-chunk math (None: the process's, `chunked_logprobs.chosen()`)."""
    shape = targets.shape
    if hidden.shape[:-1] != shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(shape)}: one target per hidden state")
    flat = hidden.reshape(-1, hidden.shape[-1])
    dtype = compute_dtype(hidden)
    logp, ent = _FusedHeadLogprobs.apply(
        flat, weight, targets.reshape(-1).long(), temperature, with_entropy, dtype, math or chosen()
    )
    if not with_entropy:
        return logp.view(shape), None
    if not entropy_grad:
        ent = ent.detach()
    return logp.view(shape), ent.view(shape)
