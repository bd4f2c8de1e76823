"""Top-k log-probs from a model's logits, for the top-k distillation loss (algos/distillation.py, verl 0.9's
forward_kl_topk): the teacher's k likeliest tokens and their log-probs at each position, and the student's log-probs
of those same tokens with its own k likeliest.

    log p(j) = z_j - lse(z),   z = logits / T

log_softmax is monotonic, so the top k of the logits are those of the log-probs. Only the k gathered values and one
logsumexp per position are made beyond the logits (in fp32, or the logits' wider dtype), by verl's chunked identity
log_softmax(z).gather(j) = z_j - lse(z).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def teacher_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] -> (the k largest log-probs [..., K] in fp32 or wider, in descending order, their token ids
    [..., K])."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    top = z.topk(k, dim=-1)
    return top.values - torch.logsumexp(z, -1, keepdim=True), top.indices


def logprobs_at(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V], ids [..., K] -> (log-probs of softmax(logits / temperature) at ids [..., K], fp32 or wider, with
    their gradient; the ids of its own k likeliest tokens [..., K])."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature != 1.0:
        z = z / temperature
    own = z.detach().topk(ids.shape[-1], dim=-1).indices
    return z.gather(-1, ids.long()) - torch.logsumexp(z, -1, keepdim=True), own
