"""Ulysses sequence parallelism (`ulysses_sequence_parallel_size`, as verl's): the ranks of a sequence-parallel
group hold the same samples, and each runs the model on its slice of the packed sequence columns. Everything but
attention acts on each position alone, so only attention needs the other slices: around it, an all-to-all trades
the sequence split for a head split (every rank then attends over the whole sequence with 1/sp of the heads),
and a second all-to-all trades back. Rotary embeddings are applied before the first trade, from each slice's own
position ids, so they need nothing.

    q, k, v:  [B, H, S/sp, D] on each rank  --all-to-all-->  [B, H/sp, S, D]  -- attention --
    out:      [B, S, H/sp, D]  --all-to-all-->  [B, S/sp, H, D]

The per-token outputs (log-probs, entropy, values) are computed for each rank's own positions and summed over
the group into the whole vector. Every rank of the group then computes the same loss; the sum's backward is a
sum too, so each rank's positions get sp times their gradient, and the data-parallel mean over all world ranks
(dp x sp of them) is the mean over the dp groups: the same gradient as sp=1 over dp ranks (verl's gather with
its grad scaler).

Attention itself is the model's own implementation (sdpa, or flash-attention on GPUs), given the whole
sequence: sdpa a block-diagonal causal mask built from the group's position ids (each packed sequence restarts
at 0), flash-attention those position ids, from which it makes its varlen call.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import packing
from .parallel import group_holding


@dataclass(frozen=True)
class SeqParallel:
    group: object  # the torch.distributed group of this rank's sequence-parallel ranks
    size: int
    rank: int  # this rank's place in its group: which slice of the columns it holds


def make_groups(rank: int, world: int, size: int) -> SeqParallel | None:
    """Consecutive ranks form a group (on 8-GPU nodes the all-to-alls stay inside a node for size <= 8). Every
    rank creates every group, in order, as torch.distributed requires."""
    if size <= 1:
        return None
    g, ranks = group_holding(rank, [list(range(first, first + size)) for first in range(0, world, size)])
    return SeqParallel(g, size, rank - ranks[0])


def head_refusal(config, size: int) -> str | None:
    """Why a model cannot split its heads `size` ways (verl asserts the same), or None."""
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    if heads % size:
        return f"the model's {heads} attention heads do not split over ulysses_sequence_parallel_size={size}"
    if kv % size and size % kv:
        return f"the model's {kv} key-value heads neither split over nor divide ulysses_sequence_parallel_size={size}"
    return None


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 of a [size, ...] tensor: row k goes to rank k. Its own inverse, so the
    backward is the same exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)  # of the contiguous input: empty_like keeps a transposed tensor's strides
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


class _AllReduceSum(torch.autograd.Function):
    """The sum over the group; the backward sums the gradients (see the module docstring for why that scales)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


def group_sum(x: torch.Tensor, sp: SeqParallel) -> torch.Tensor:
    return _AllReduceSum.apply(x, sp.group)


def seq_to_heads(x: torch.Tensor, sp: SeqParallel) -> torch.Tensor:
    """[B, H, S/sp, D] (this rank's columns, all heads) -> [B, H/sp, S, D] (all columns, this rank's heads)."""
    b, h, s, d = x.shape
    x = x.view(b, sp.size, h // sp.size, s, d).transpose(0, 1)  # [sp, B, H/sp, S/sp, D]: head group k to rank k
    x = _AllToAll.apply(x, sp.group)  # [sp, B, H/sp, S/sp, D]: row k holds rank k's columns
    return x.permute(1, 2, 0, 3, 4).reshape(b, h // sp.size, sp.size * s, d)


def heads_to_seq(x: torch.Tensor, sp: SeqParallel) -> torch.Tensor:
    """[B, S, H/sp, D] (attention's output layout) -> [B, S/sp, H, D]."""
    b, s, h, d = x.shape
    x = x.view(b, sp.size, s // sp.size, h, d).transpose(0, 1)  # [sp, B, S/sp, H/sp, D]: column slice k to rank k
    x = _AllToAll.apply(x, sp.group)  # row k: rank k's heads for this rank's columns
    return x.permute(1, 2, 0, 3, 4).reshape(b, s // sp.size, sp.size * h, d)


def packed_causal_mask(position_ids: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """[B, 1, S, S] bool, True where query i may attend key j: the same packed sequence (a new one starts
    wherever the position is 0) and j <= i, within the sliding window when the model has one."""
    seq = (position_ids == 0).cumsum(-1)
    i = torch.arange(position_ids.shape[-1], device=position_ids.device)
    keep = (seq[:, :, None] == seq[:, None, :]) & (i[None, :, None] >= i[None, None, :])
    if sliding_window is not None:
        keep &= (position_ids[:, :, None] - position_ids[:, None, :]) < sliding_window
    return keep[:, None]


class _Heads:
    """The attention module as the inner implementation sees it, with its key-value groups per rank: repeating
    key-value heads to split them (fewer kv heads than ranks) changes how many query heads share each."""

    def __init__(self, module, kv_groups: int):
        self._module, self.num_key_value_groups = module, kv_groups

    def __getattr__(self, name):
        return getattr(self._module, name)


def _attention(inner, impl: str, sp: SeqParallel, full_positions: torch.Tensor, masks: dict):
    def attend(module, query, key, value, attention_mask, **kwargs):
        kv = key.shape[1]
        if kv % sp.size:  # fewer kv heads than ranks (head_refusal allows only sp % kv == 0): repeat each
            rep = sp.size // math.gcd(kv, sp.size)
            key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
        masks["attended"] = True
        q, k, v = (seq_to_heads(t, sp) for t in (query, key, value))
        kwargs["position_ids"] = full_positions
        if "flash" in impl:  # each sequence's bounds over the group's rows (model/packing.py attention_kwargs)
            if "varlen" not in masks:
                masks["varlen"] = packing.varlen_kwargs(full_positions)
            mask = None
            kwargs.update(masks["varlen"])
        else:
            window = kwargs.get("sliding_window")
            if ("mask", window) not in masks:
                masks["mask", window] = packed_causal_mask(full_positions, window)
            mask, kwargs["is_causal"] = masks["mask", window], False
        view = _Heads(module, q.shape[1] // k.shape[1])
        out, weights = inner(view, q, k, v, mask, **kwargs)
        return heads_to_seq(out, sp), weights

    return attend


SUPPORTED = ("sdpa", "flash_attention_2", "flash_attention_3")
_active: list[tuple] = []  # (impl, sp, full positions, masks) of the sequence-parallel forward running now


@contextlib.contextmanager
def _installed(impl: str, sp: SeqParallel, full_positions: torch.Tensor, masks: dict):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    local = ALL_ATTENTION_FUNCTIONS._local_mapping
    before = local.get(impl)
    inner = ALL_ATTENTION_FUNCTIONS[impl]
    ALL_ATTENTION_FUNCTIONS[impl] = _attention(inner, impl, sp, full_positions, masks)  # the local mapping only
    _active.append((impl, sp, full_positions, masks))
    try:
        yield
    finally:
        _active.pop()
        if before is None:
            del ALL_ATTENTION_FUNCTIONS[impl]
        else:
            ALL_ATTENTION_FUNCTIONS[impl] = before


@contextlib.contextmanager
def attention_over_group(model, sp: SeqParallel, full_positions: torch.Tensor):
    """Inside: the model's attention implementation attends over the whole packed sequence of the group
    (`full_positions`, [rows, S]) while the model holds its slice of the columns."""
    impl = packing.attention_implementation(model)
    if impl not in SUPPORTED:
        raise RuntimeError(
            f"sequence parallelism needs the sdpa or flash-attention implementation; this model uses {impl!r}"
        )
    state: dict = {}
    with _installed(impl, sp, full_positions, state):
        yield
    if not state.get("attended"):  # its attention does not go through transformers' registry: it saw one slice
        raise RuntimeError(
            f"{type(getattr(model, 'module', model)).__name__}'s attention bypasses transformers' attention functions, "
            "so it cannot attend over a sequence-parallel group; set ulysses_sequence_parallel_size=1"
        )


def checkpoint_contexts():
    """torch.utils.checkpoint's context_fn: a layer checkpointed inside a sequence-parallel forward is recomputed
    during the backward pass, after that forward has returned; the recompute must attend over the group again."""
    if not _active:
        return contextlib.nullcontext(), contextlib.nullcontext()
    return contextlib.nullcontext(), _installed(*_active[-1])


def columns(t: torch.Tensor, sp: SeqParallel) -> torch.Tensor:
    """This rank's slice of the columns of [rows, S] (S a multiple of sp.size)."""
    width = t.shape[1] // sp.size
    return t[:, sp.rank * width : (sp.rank + 1) * width]


def local_positions(at: torch.Tensor, width: int, sp: SeqParallel) -> tuple[torch.Tensor, torch.Tensor]:
    """Of the flat indices `at` into [rows, width]: which fall in this rank's columns (a bool over `at`), and their
    flat indices into this rank's [rows, width / sp] slice."""
    w = width // sp.size
    row, col = at // width, at % width
    mine = (col >= sp.rank * w) & (col < (sp.rank + 1) * w)
    return mine, row[mine] * w + col[mine] - sp.rank * w
