"""`trainer.balance_batch` (verl's key, on by default): once every worker has sampled and scored its prompts,
the workers trade whole prompt groups so that each holds about the same work for the passes that follow
(log-probs, reference, values, update), which wait at every collective for the slowest worker. It pays where
the work follows the tokens (`use_remove_padding`, `use_dynamic_bsz`); padded forwards cost the widest sequence.

Whole groups move (a prompt's n samples stay together, as in verl's balancing under its prefix grouper), since
each worker computes its own groups' advantages; each worker keeps equally many groups, so mini batches and the
per-sequence metrics keep their sizes. verl's plain balancing may split a group across ranks because its driver
computes advantages for the whole batch; here a group of n = 1 (GAE, REINFORCE++) is one sample, the same thing.
Where a rollout pool's batch is shared by sample and groups are split anyway, the workers compute the advantages over
the whole batch too (batch/split_groups.py), and single samples move (the caller's n = 1).

Work per sequence is verl's estimate of a transformer's forward cost (`workload`), and the parts come from a
greedy assignment: heaviest group first, each into the lightest part that still has room (kept as sampled where
that would leave the heaviest worker no lighter). The metrics are verl's `global_seqlen/*`: tokens per worker
before and after."""

from __future__ import annotations

import torch

from ..model.parallel import gather_rows
from .exchange import exchange
from .step_batch import StepBatch


def workload(seqlen: torch.Tensor) -> torch.Tensor:
    # FLOPs of a dense block ~ 12 h^2 s + 2 h s^2; with verl's h = 4096 (a 7B model), in units of 2h: 24576 s + s^2
    return 24576 * seqlen + seqlen**2


def partition(loads: list[int], parts: int) -> list[list[int]]:
    """Indices of `loads` in `parts` parts of len(loads) // parts items each and near-equal totals; each part in
    ascending index order."""
    room = len(loads) // parts
    out: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for i in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        p = min((p for p in range(parts) if len(out[p]) < room), key=lambda p: (totals[p], p))
        out[p].append(i)
        totals[p] += loads[i]
    return [sorted(p) for p in out]


def as_sampled(groups: int, parts: int) -> list[list[int]]:
    per = groups // parts
    return [list(range(p * per, (p + 1) * per)) for p in range(parts)]


def assign(loads: list[int], parts: int) -> list[list[int]]:
    """Each worker's groups: the greedy partition, or the groups where they were sampled when that leaves the
    heaviest worker no lighter (greedy can lose to a split that is already even; no trade is then cheaper)."""
    heaviest = lambda assignment: max(sum(loads[g] for g in p) for p in assignment)
    return min([as_sampled(len(loads), parts), partition(loads, parts)], key=heaviest)  # min keeps the first on a tie


def seqlen_metrics(before: list[int], after: list[int]) -> dict:
    """verl's global_seqlen/*: each worker's tokens (prompt + response) as sampled and as balanced."""
    return {
        "global_seqlen/min": min(before),
        "global_seqlen/max": max(before),
        "global_seqlen/minmax_diff": max(before) - min(before),
        "global_seqlen/balanced_min": min(after),
        "global_seqlen/balanced_max": max(after),
        "global_seqlen/mean": sum(before) / len(before),
    }


def balance(batch: StepBatch, n: int, pad_id: int) -> tuple[StepBatch, dict]:
    """Every worker calls this at the same point of its step (collectives over all of them). First each worker's
    tokens per sample, from which every worker computes the same assignment; then, when groups move, everyone's
    samples (batch/exchange.py)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    heads = gather_rows(batch.attention_mask.sum(-1).to(torch.int64)[None]).cpu()
    groups = heads.reshape(-1, n)  # each sample's tokens (prompt + response), a row per prompt group
    parts, sampled = assign(workload(groups).sum(-1).tolist(), world), as_sampled(len(groups), world)
    tokens = lambda assignment: [int(groups[p].sum()) for p in assignment]
    metrics = seqlen_metrics(tokens(sampled), tokens(parts))
    if parts == sampled:
        return batch, metrics
    rows = torch.tensor([g * n + j for g in parts[rank] for j in range(n)], device=batch.input_ids.device)
    return exchange(batch, rows, pad_id), metrics
