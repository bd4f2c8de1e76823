"""`trainer.balance_batch` (verl's key, on by default): once every worker has sampled and scored its prompts,
the workers trade whole prompt groups so that each holds about the same work for the passes that follow
(log-probs, reference, values, update), which wait at every collective for the slowest worker.

Whole groups move (a prompt's n samples stay together, as in verl's balancing under its prefix grouper), since
each worker computes its own groups' advantages; each worker keeps equally many groups, so mini batches and the
per-sequence metrics keep their sizes. verl's plain balancing may split a group across ranks because its driver
computes advantages for the whole batch; here a group of n = 1 (GAE, REINFORCE++) is one sample, the same thing.

Work per sequence is verl's estimate of a transformer's forward cost (`workload`), and the parts come from a
greedy assignment: heaviest group first, each into the lightest part that still has room (kept as sampled where
that would leave the heaviest worker no lighter). The metrics are
verl's `global_seqlen/*`: tokens per worker before and after."""

from __future__ import annotations

import torch

from .engines import Rollout
from .generate_score import Scored

KEY = "trainer.balance_batch"


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
    return {"global_seqlen/min": min(before), "global_seqlen/max": max(before),
            "global_seqlen/minmax_diff": max(before) - min(before), "global_seqlen/balanced_min": min(after),
            "global_seqlen/balanced_max": max(after), "global_seqlen/mean": sum(before) / len(before)}


# what travels: token ids as int32 and masks as bool, a quarter and an eighth of their int64 size
_COMPACT = {"prompt_ids": torch.int32, "response_ids": torch.int32, "prompt_mask": torch.bool, "response_attn": torch.bool,
            "response_mask": torch.bool, "mask": torch.bool}


def _named(ro: Rollout, sc: Scored, baselines) -> dict:
    """A worker's samples by name, prompts and responses apart so that workers' widths can differ."""
    P = ro.prompt_len
    return {"prompt_ids": ro.input_ids[:, :P], "prompt_mask": ro.attention_mask[:, :P], "response_ids": ro.input_ids[:, P:],
            "response_attn": ro.attention_mask[:, P:], "response_mask": ro.response_mask, "mask": sc.mask,
            "scores": sc.scores, "token_scores": sc.token_scores, "engine_logp": ro.engine_logp, "baselines": baselines}


def _pad(t: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    pad = t.new_full((t.shape[0], width - t.shape[1]), value)
    return torch.cat([pad, t] if left else [t, pad], 1)


def join(per_worker: list[dict], pad_id: int) -> dict:
    """All workers' samples in worker order: prompts left-padded and responses right-padded to the widest."""
    P = max(f["prompt_ids"].shape[1] for f in per_worker)
    R = max(f["response_ids"].shape[1] for f in per_worker)
    widths = {"prompt_ids": (P, pad_id, True), "prompt_mask": (P, 0, True), "response_ids": (R, pad_id, False)}
    out = {}
    for k in per_worker[0]:
        if per_worker[0][k] is None:
            out[k] = None
            continue
        parts = [f[k] for f in per_worker]
        if parts[0].dim() == 2:
            width, value, left = widths.get(k, (R, 0, False))
            parts = [_pad(t, width, value, left) for t in parts]
        out[k] = torch.cat(parts)
    return out


def take(all_rows: dict, rows: list[int], like: dict) -> tuple[Rollout, Scored, torch.Tensor | None]:
    """This worker's share: the given rows, with the prompt columns that none of them uses left out, on the device
    and in the dtypes of `like` (the worker's own fields as it sampled them)."""
    f = {k: v[rows] if v is not None else None for k, v in all_rows.items()}
    used = f["prompt_mask"].any(0).nonzero()
    first = int(used[0]) if len(used) else f["prompt_mask"].shape[1] - 1
    f["prompt_ids"], f["prompt_mask"] = f["prompt_ids"][:, first:], f["prompt_mask"][:, first:]
    f = {k: v.to(like[k].device, like[k].dtype) if v is not None else None for k, v in f.items()}
    ro = Rollout(torch.cat([f["prompt_ids"], f["response_ids"]], 1), torch.cat([f["prompt_mask"], f["response_attn"]], 1),
                 f["response_mask"], f["prompt_ids"].shape[1], f["engine_logp"])
    return ro, Scored(ro, f["mask"], f["scores"], f["token_scores"]), f["baselines"]


def balance(ro: Rollout, sc: Scored, baselines, n: int, pad_id: int) -> tuple[Rollout, Scored, torch.Tensor | None, dict]:
    """Every worker calls this at the same point of its step (a collective over all of them)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    own, per_worker = _named(ro, sc, baselines), [None] * world
    dist.all_gather_object(per_worker, {k: v.to("cpu", _COMPACT.get(k, v.dtype)) if v is not None else None
                                        for k, v in own.items()})
    everything = join(per_worker, pad_id)
    seqlen = torch.cat([everything["prompt_mask"], everything["response_attn"]], 1).sum(-1)
    groups = seqlen.view(-1, n)  # each sample's tokens, a row per prompt group
    parts = assign(workload(groups).sum(-1).tolist(), world)
    mine = [g * n + j for g in parts[rank] for j in range(n)]
    tokens = lambda parts: [int(groups[p].sum()) for p in parts]
    return (*take(everything, mine, own), seqlen_metrics(tokens(as_sampled(len(groups), world)), tokens(parts)))
