"""Samples moving between the workers of one data-parallel group: every worker's batch all-gathered, field by
field on the workers' own devices (NCCL on GPUs, Gloo on CPU), and each worker keeping the rows it is given.
Balancing (batch/balance.py) and PF-PPO's resampling (the draw: algos/pf_ppo.py) both move samples this way."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..algos import pf_ppo
from ..model.parallel import gather_rows
from ..rollout.engines.base import left_pad_to
from .step_batch import SEQUENCE_FIELDS, StepBatch


def exchange(batch: StepBatch, rows: torch.Tensor, pad_id: int, group=None) -> StepBatch:
    """This worker's share of every worker's samples (of `group`'s workers; None: all): `rows` of them in worker order
    (each worker holds as many).
    Prompts are widened to the widest worker's (each worker padded its own to its longest), then cut to the widest
    of the rows taken; responses are as wide on every worker (the engines pad them to max_response_length).
    A collective: every worker calls it at the same point, with the same fields set."""
    width = torch.tensor([batch.prompt_len], device=batch.input_ids.device)
    dist.all_reduce(width, op=dist.ReduceOp.MAX, group=group)
    width, p = int(width.item()), batch.prompt_len
    widen = lambda t, fill: torch.cat([left_pad_to(t[:, :p], width, fill), t[:, p:]], 1)
    fields = batch.per_sample()
    spans = [k for k, v in fields.items() if v is not None and StepBatch.spans_prompt(k)]
    for k in spans:
        fill = SEQUENCE_FIELDS[k]
        fields[k] = widen(fields[k], pad_id if fill is None else fill)
    taken = {k: None if v is None else gather_rows(v, group)[rows] for k, v in fields.items()}
    used = taken["attention_mask"][:, :width].any(0).nonzero()
    first = int(used[0]) if len(used) else width - 1
    taken.update({k: taken[k][:, first:] for k in spans})
    return StepBatch(prompt_len=width - first, **taken)


def sequence_parallel_share(batch: StepBatch, sp, pad_id: int) -> StepBatch:
    """Every sample of the worker's sequence-parallel group (model/ulysses.py), the same on each of its ranks."""
    rows = torch.arange(len(batch) * sp.size, device=batch.input_ids.device)
    return exchange(batch, rows, pad_id, sp.group)


def pf_ppo_resample(batch: StepBatch, method: str, weight_pow: float, seed: int, pad_id: int) -> StepBatch:
    """The draw over every worker's samples, weighted by each sample's score (the sum of its token scores), and
    this worker's share of it. Every worker holds as many samples."""
    scores = batch.token_scores.sum(-1)
    b, rank = len(scores), dist.get_rank()
    idx = pf_ppo.draw(gather_rows(scores), method, weight_pow, torch.Generator().manual_seed(seed))
    return exchange(batch, idx[rank * b : (rank + 1) * b].to(scores.device), pad_id)
