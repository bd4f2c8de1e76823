"""Log-probs and entropy of the sampled tokens from the logits, a chunk of tokens at a time (as verl's fused
kernels avoid the full copies): with a 152k vocabulary, one fp32 copy of a micro batch's logits is about
0.6 MB per token, and the plain formulas make several (the fp32 cast, logsumexp's exponentials, the softmax,
its product with the logits), each kept for the backward pass. Here no fp32 tensor is larger than one chunk,
forward or backward: the backward pass recomputes each chunk's softmax from the logits it was given instead
of keeping it.

    log p(y) = z_y - lse(z),   lse(z) = log sum_v exp(z_v)
    H        = lse(z) - sum_v p_v z_v,   p = softmax(z)
    d log p(y) / dz = onehot(y) - p
    d H / dz        = -p * (z - lse(z) + H)      (= -p (log p + H))

with z = logits / T, the sampling temperature, as verl divides the logits before every log-prob (so the ratio
compares the distribution the engine sampled from): d/dlogits = d/dz / T.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

CHUNK_ELEMENTS = 2**25  # fp32 elements of one chunk's copy of the logits: 128 MiB
# on a GPU a chunk costs a dozen kernel launches whatever its size, and the host, not the GPU, sets the pace at 128
# MiB (about 220 tokens of a 152k vocabulary); 512 MiB chunks (about 880 tokens) keep it busy
CUDA_CHUNK_ELEMENTS = 2**27


def chunk_tokens(vocab: int, device: torch.device | None = None) -> int:
    """Tokens per chunk: as many as keep one fp32 [chunk, vocab] tensor within the device's budget."""
    budget = CUDA_CHUNK_ELEMENTS if device is not None and device.type == "cuda" else CHUNK_ELEMENTS
    return max(1, budget // vocab)


def chunk_forward(
    z: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk's log p(y) [n], lse(z) [n] and entropy [n] (None unless with_entropy) from z, a fresh fp32 copy of
    the chunk's logits [n, V] that this changes in place (so no second chunk-sized tensor is made)."""
    if temperature != 1.0:  # a pass over the chunk that changes nothing at 1.0
        z.div_(temperature)
    lse = torch.logsumexp(z, -1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    ent = None
    if with_entropy:
        z.sub_(lse[:, None])  # log p, in place: one chunk-sized tensor at a time
        ent = -(z.exp() * z).sum(-1)
    return logp, lse, ent


def chunk_grad(
    z: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    ent: torch.Tensor | None,
    grad_logp: torch.Tensor | None,
    grad_ent: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    """d loss / d logits [n, V] fp32 of one chunk, from z, a fresh fp32 copy of its logits that this changes in place,
    the forward's lse and entropy (None: computed without), and the chunk's incoming gradients (None: none)."""
    if temperature != 1.0:
        z.div_(temperature)
    log_p = z.sub_(lse[:, None])
    p = log_p.exp()
    if grad_ent is not None and ent is not None:  # dH/dz = -p (log p + H)
        g = log_p.add_(ent[:, None]).mul_(p).mul_(-grad_ent[:, None])
    else:
        g = torch.zeros_like(p)
    if grad_logp is not None:  # d log p(y)/dz = onehot(y) - p
        gl = grad_logp[:, None]
        g.addcmul_(p, gl, value=-1)
        g.scatter_add_(-1, targets[:, None], gl)
    if temperature != 1.0:
        g.div_(temperature)
    return g


def chunk_slice(grad: torch.Tensor | None, s: int, step: int) -> torch.Tensor | None:
    return None if grad is None else grad[s : s + step]


def logits_forward(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """chunk_forward of one chunk of the logits as given (any float dtype, left unchanged)."""
    return chunk_forward(logits.to(torch.float32, copy=True), targets, temperature, with_entropy)  # copy: fp32 too


def logits_grad(
    logits: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    ent: torch.Tensor | None,
    grad_logp: torch.Tensor | None,
    grad_ent: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    """chunk_grad of one chunk of the logits as given, in their dtype."""
    z = logits.to(torch.float32, copy=True)
    return chunk_grad(z, targets, lse, ent, grad_logp, grad_ent, temperature).to(logits.dtype)


@dataclass(frozen=True)
class ChunkMath:
    """The per-chunk math a log-prob pass runs, with the signatures of logits_forward and logits_grad: the chunk's
    logits as given in, fp32 log-probs, lse and entropy out; its gradient out in the logits' dtype. EAGER runs those
    two; model/compiled.py holds the same two through torch.compile (actor_rollout_ref.*.fsdp_config.
    use_torch_compile), which may fuse the fp32 cast into the math. Every choice gives the same numbers up to
    rounding."""

    forward: Callable = logits_forward
    grad: Callable = logits_grad


EAGER = ChunkMath()
_chosen = EAGER


def use(math: ChunkMath) -> None:
    """The math of this process's log-prob passes where a pass names none: set once, when the worker builds its
    models (model/compiled.py decides which), so no pass decides again."""
    global _chosen
    _chosen = math


def chosen() -> ChunkMath:
    return _chosen


class _TokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, with_entropy: bool, temperature: float, math: ChunkMath):
        n, vocab = logits.shape
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        ent = torch.empty_like(logp) if with_entropy else None
        step = chunk_tokens(vocab, logits.device)
        for s in range(0, n, step):
            y = targets[s : s + step]
            logp[s : s + step], lse[s : s + step], e = math.forward(logits[s : s + step], y, temperature, with_entropy)
            if with_entropy:
                ent[s : s + step] = e
        ctx.save_for_backward(logits, targets, lse, ent if with_entropy else lse)
        ctx.with_entropy, ctx.temperature, ctx.math = with_entropy, temperature, math
        ctx.set_materialize_grads(False)
        return (logp, ent) if with_entropy else (logp, lse.new_zeros(0))

    @staticmethod
    def backward(ctx, grad_logp, grad_ent):
        logits, targets, lse, ent = ctx.saved_tensors
        if grad_logp is None and grad_ent is None:
            return None, None, None, None, None
        n, vocab = logits.shape
        grad = torch.empty_like(logits)
        step = chunk_tokens(vocab, logits.device)
        for s in range(0, n, step):
            grad[s : s + step] = ctx.math.grad(
                logits[s : s + step],
                targets[s : s + step],
                lse[s : s + step],
                ent[s : s + step] if ctx.with_entropy else None,
                chunk_slice(grad_logp, s, step),
                chunk_slice(grad_ent, s, step),
                ctx.temperature,
            )
        return grad, None, None, None, None


def plain_logprobs_and_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same two numbers by the plain formulas, all of the logits at once in fp32 (an fp32 copy, logsumexp's
    exponentials, a full softmax, each kept for backward): the reference the tests and bench/memory.py hold the
    chunked pass against."""
    z = logits.float()
    lse = torch.logsumexp(z, -1)
    return z.gather(-1, targets[..., None]).squeeze(-1) - lse, lse - (torch.softmax(z, -1) * z).sum(-1)


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    temperature: float = 1.0,
    math: ChunkMath | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [..., V] (any float dtype), targets [...] -> log p(target) [...] and the entropy [...] (or None),
    both fp32, of softmax(logits / temperature). entropy_grad=False: the entropy is a metric only, with no
    gradient. math: the per-chunk math (None: the process's, `chosen()`)."""
    shape = targets.shape
    flat_logits, flat_targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    logp, ent = _TokenLogprobs.apply(flat_logits, flat_targets, with_entropy, temperature, math or _chosen)
    if not with_entropy:
        return logp.view(shape), None
    if not entropy_grad:
        ent = ent.detach()
    return logp.view(shape), ent.view(shape)


@torch.no_grad()
def token_sum_pi_squared(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """logits [..., V] -> sum_v p_v^2 [...] in fp32, a chunk of tokens at a time (the optimal token baseline's
    statistic, computed only in the no-grad old-log-prob pass), as verl's calculate_sum_pi_squared_from_logits:

        sum_v p_v^2 = sum_v exp(2 z_v - 2 lse(z)) = exp(lse(2z) - 2 lse(z))
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    step = chunk_tokens(flat.shape[1], flat.device)
    for s in range(0, flat.shape[0], step):
        z = flat[s : s + step].to(torch.float32, copy=True)
        if temperature != 1.0:
            z.div_(temperature)
        lse = torch.logsumexp(z, -1)
        out[s : s + step] = torch.exp(torch.logsumexp(z.mul_(2), -1) - 2 * lse)
    return out.view(logits.shape[:-1])
