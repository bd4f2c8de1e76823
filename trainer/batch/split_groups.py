"""Prompt groups cut apart between workers. A rollout pool's batch is shared by sample, as verl dispatches its batch,
so where the step's prompts, or a mini batch's, do not divide evenly over the data-parallel groups of workers
(model/micro_batches.py's splits_groups), a prompt's n samples may sit on two workers; balancing then moves single
samples (verl's plain balance_batch), which scatters them further.

Everything but the advantages works sample by sample, or sums over the whole batch. The group estimators (GRPO,
RLOO, OPO, ...) need each prompt's samples together: verl computes them on its driver over the whole batch, and
here every worker does, over every data-parallel group's samples gathered, then keeps its own rows."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from ..algos.core_algos import local
from ..algos.estimators.registry import AdvantageInput
from ..model.parallel import gather_rows, group_holding

TENSORS = (
    "token_rewards",
    "mask",
    "values",
    "baselines",
    "old_logp",
    "sum_pi_squared",
    "is_weights",
    "components",
)


def peer_group(rank: int, world: int, sp_size: int):
    """The ranks holding distinct samples with this one: one of each sequence-parallel group (ulysses.make_groups's
    consecutive ranks), the ones at this rank's place in theirs. None (every rank) without sequence parallelism.
    Every rank creates every group, in order, as torch.distributed requires."""
    if sp_size <= 1:
        return None
    return group_holding(rank, [list(range(place, world, sp_size)) for place in range(sp_size)])[0]


def whole_batch_advantages(fn, x: AdvantageInput, peers=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimator `fn` over every worker's samples (of `peers`, which hold them once each), and this worker's rows
    of its advantages and returns. A collective: every worker calls it at the same point, each with as many rows.
    Batch statistics are then plain sums, the whole batch being here."""
    rows, at = len(x.index), dist.get_rank(peers)
    whole = {k: None if getattr(x, k) is None else gather_rows(getattr(x, k), peers) for k in TENSORS}
    index = gather_rows(torch.as_tensor(x.index, device=x.mask.device), peers).tolist()
    advantages, returns = fn(dataclasses.replace(x, **whole, index=index, allreduce=local))
    mine = slice(at * rows, (at + 1) * rows)
    return advantages[mine], returns[mine]
