"""Padding-free forwards (`model.use_remove_padding`, as verl): responses stop at very different
lengths, so the padded [B, P + R] layout spends much of its compute on pad. Instead the real tokens
of several sequences share a row (first-fit, longest first, rows as wide as the padded batch), each
sequence kept to itself by position ids that restart at 0: transformers turns those into a
block-diagonal mask for sdpa/eager. Flash-attention finds the sequences in the position ids only in a batch of one
row (transformers' _is_packed_sequence), and otherwise attends causally over each whole row, across its sequences:
with several rows it is handed each sequence's bounds (`attention_kwargs`). Rows no wider than
the padded batch keep sdpa's attention cost at most the padded one (one row for the whole batch
made it quadratic in the batch's tokens: 2.3x slower than padded on an H100).
The results come back in the padded [B, R] layout the losses use, zero where there is no token."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packed:
    input_ids: torch.Tensor  # [rows, W]
    position_ids: torch.Tensor  # [rows, W]: 0.. per sequence; leftover tails count from 0 as a sequence of their own
    at: torch.Tensor  # [N] flat index into rows * W of each real response token
    filled: torch.Tensor  # [B, R] which response slots hold a real token
    tokens: torch.Tensor  # [T] flat index into rows * W of every real token, in input_ids[attention_mask.bool()] order


def first_fit(lengths: list[int], width: int) -> tuple[list[int], list[int], list[int]]:
    """(row of each sequence, its first column there, how full each row is): longest first, each into
    the first row with room."""
    row, start, used = [0] * len(lengths), [0] * len(lengths), []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = next((r for r, u in enumerate(used) if u + lengths[i] <= width), len(used))
        if r == len(used):
            used.append(0)
        row[i], start[i] = r, used[r]
        used[r] += lengths[i]
    return row, start, used


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, pad_id: int = 0, multiple: int = 1
) -> Packed:
    """Rows as wide as the padded batch, rounded up to a `multiple` (sequence parallelism splits the columns)."""
    dev, width = input_ids.device, -(-input_ids.shape[1] // multiple) * multiple
    keep = attention_mask.bool()
    row, start, used = first_fit(attention_mask.sum(1).tolist(), width)
    rank = attention_mask.long().cumsum(1) - 1  # each real token's place within its sequence
    base = torch.tensor(row, device=dev) * width + torch.tensor(start, device=dev)
    dest = base[:, None] + rank  # where each token goes in the flat [rows * W]
    rows = max(len(used), 1)
    ids = torch.full((rows * width,), pad_id, dtype=input_ids.dtype, device=dev)
    ids[dest[keep]] = input_ids[keep]
    cols = torch.arange(width, device=dev)[None]
    pos = (cols - torch.tensor(used or [0], device=dev)[:, None]).clamp_min(0).flatten()  # the tails
    pos[dest[keep]] = rank[keep]
    filled = keep[:, prompt_len:]
    return Packed(ids.view(rows, width), pos.view(rows, width), dest[:, prompt_len:][filled], filled, dest[keep])


# transformers' attention implementations that read a packed forward's sequences from FlashAttentionKwargs
FLASH = ("flash_attention_2", "flash_attention_3", "flash_attention_4")


def attention_kwargs(model, position_ids: torch.Tensor) -> dict:
    """What a forward of packed rows (`position_ids` [rows, W]) passes the model beside its inputs: under a
    flash-attention implementation, each sequence's bounds in the rows laid end to end (`varlen_kwargs`); nothing
    under sdpa and eager, whose mask transformers builds from the position ids."""
    return varlen_kwargs(position_ids) if attention_implementation(model) in FLASH else {}


def attention_implementation(model) -> str:
    """The attention implementation `model` (or the module a DDP wrapper holds) runs with: transformers' name."""
    return getattr(model, "module", model).config._attn_implementation


def varlen_kwargs(position_ids: torch.Tensor) -> dict:
    """transformers' FlashAttentionKwargs for the sequences of `position_ids` (each starts at 0), over all its rows
    flattened, as its flash path flattens the batch when they are given: what its own packed path computes
    (prepare_fa_kwargs_from_position_ids), for all the rows."""
    from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(position_ids)
    return {"cu_seq_lens_q": cu_q, "cu_seq_lens_k": cu_k, "max_length_q": max_q, "max_length_k": max_k}


def unpack(values: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
    """[N] values of the response tokens -> [B, R], zero on padding; differentiable."""
    return values.new_zeros(filled.shape).masked_scatter(filled, values)
