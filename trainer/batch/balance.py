"""`trainer.balance_batch` (verl's key, on by default): once every worker has sampled and scored its prompts,
the workers trade whole prompt groups so that each holds about the same work for the passes that follow
(log-probs, reference, values, update), which wait at every collective for the slowest worker. It pays where
the work follows the tokens (`use_remove_padding`, `use_dynamic_bsz`); padded forwards cost the widest sequence.

Whole groups move (a prompt's n samples stay together, as in verl's balancing under its prefix grouper), since
each worker computes its own groups' advantages; each worker keeps equally many groups, so mini batches and the
per-sequence metrics keep their sizes. verl's plain balancing may split a group across ranks because its driver
computes advantages for the whole batch; here a group of n = 1 (GAE, REINFORCE++) is one sample, the same thing.

Work per sequence is verl's estimate of a transformer's forward cost (`workload`), and the parts come from a
greedy assignment: heaviest group first, each into the lightest part that still has room (kept as sampled where
that would leave the heaviest worker no lighter). The metrics are verl's `global_seqlen/*`: tokens per worker
before and after."""

from __future__ import annotations

import torch

from rlrig.trainer.model.parallel import gather_rows
from rlrig.trainer.reward.scoring import Scored
from rlrig.trainer.rollout.engines.base import Rollout, left_pad_to


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


def take(ro: Rollout, sc: Scored, baselines, rows: torch.Tensor, width: int, pad_id: int):
    """This worker's share of every worker's samples: `rows` of them in worker order. Prompts are widened to the
    widest worker's (each worker padded its own to its longest), then cut to the widest of the rows taken;
    responses are as wide on every worker (the engines pad them to max_response_length)."""
    gather = lambda t: None if t is None else gather_rows(t)[rows]
    widen = lambda t, fill: torch.cat([left_pad_to(t[:, : ro.prompt_len], width, fill), t[:, ro.prompt_len :]], 1)
    ids, attn = gather(widen(ro.input_ids, pad_id)), gather(widen(ro.attention_mask, 0))
    used = attn[:, :width].any(0).nonzero()
    first = int(used[0]) if len(used) else width - 1
    out = Rollout(ids[:, first:], attn[:, first:], gather(ro.response_mask), width - first, gather(ro.engine_logp))
    return out, Scored(out, gather(sc.mask), gather(sc.scores), gather(sc.token_scores)), gather(baselines)


def balance(
    ro: Rollout, sc: Scored, baselines, n: int, pad_id: int
) -> tuple[Rollout, Scored, torch.Tensor | None, dict]:
    """Every worker calls this at the same point of its step (collectives over all of them). First each worker's
    prompt width and tokens per sample, from which every worker computes the same assignment; then, when groups
    move, everyone's samples, each tensor all-gathered on the workers' own devices (NCCL on GPUs, Gloo on CPU)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    head = torch.cat([torch.tensor([ro.prompt_len], device=ro.input_ids.device), ro.attention_mask.sum(-1)])
    heads = gather_rows(head.to(torch.int64)[None]).cpu()
    groups = heads[:, 1:].reshape(-1, n)  # each sample's tokens (prompt + response), a row per prompt group
    parts, sampled = assign(workload(groups).sum(-1).tolist(), world), as_sampled(len(groups), world)
    tokens = lambda assignment: [int(groups[p].sum()) for p in assignment]
    metrics = seqlen_metrics(tokens(sampled), tokens(parts))
    if parts == sampled:
        return ro, sc, baselines, metrics
    rows = torch.tensor([g * n + j for g in parts[rank] for j in range(n)], device=ro.input_ids.device)
    return (*take(ro, sc, baselines, rows, int(heads[:, 0].max()), pad_id), metrics)
