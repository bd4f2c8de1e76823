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

from .engines import Rollout
from .generate_score import Scored

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


def _named(ro: Rollout, sc: Scored, baselines) -> dict:
    """A worker's samples by name, prompts and responses apart so that workers' widths can differ."""
    P = ro.prompt_len
    return {"prompt_ids": ro.input_ids[:, :P], "prompt_mask": ro.attention_mask[:, :P], "response_ids": ro.input_ids[:, P:],
            "response_attn": ro.attention_mask[:, P:], "response_mask": ro.response_mask, "mask": sc.mask,
            "scores": sc.scores, "token_scores": sc.token_scores, "engine_logp": ro.engine_logp, "baselines": baselines}


def _pad(t: torch.Tensor, width: int, value, left: bool) -> torch.Tensor:
    pad = t.new_full((t.shape[0], width - t.shape[1]), value)
    return torch.cat([pad, t] if left else [t, pad], 1)


def padded(f: dict, P: int, R: int, pad_id: int) -> dict:
    """A worker's fields at the widest prompt (P, left-padded) and response (R, right-padded) of all workers."""
    prompt = {"prompt_ids": pad_id, "prompt_mask": 0}
    return {k: None if t is None else _pad(t, P, prompt[k], True) if k in prompt else
            _pad(t, R, pad_id if k == "response_ids" else 0, False) if t.dim() == 2 else t for k, t in f.items()}


def _pack(f: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Two tensors to all-gather: token ids and integer masks as int32, floats as float32, a field after another."""
    cols = lambda t: t if t.dim() == 2 else t[:, None]
    ints = [cols(t).to(torch.int32) for t in f.values() if t is not None and not t.is_floating_point()]
    floats = [cols(t).to(torch.float32) for t in f.values() if t is not None and t.is_floating_point()]
    return torch.cat(ints, 1), torch.cat(floats, 1)


def _unpack(ints: torch.Tensor, floats: torch.Tensor, like: dict) -> dict:
    """The fields again, from tensors packed as _pack packs `like` (shapes and dtypes as like's)."""
    out, at = {}, {False: 0, True: 0}
    for k, t in like.items():
        if t is None:
            out[k] = None
            continue
        src, w = (floats if t.is_floating_point() else ints), (t.shape[1] if t.dim() == 2 else 1)
        col = at[t.is_floating_point()]
        piece = src[:, col:col + w]
        out[k] = (piece if t.dim() == 2 else piece[:, 0]).to(t.dtype)
        at[t.is_floating_point()] += w
    return out


def take(all_rows: dict, rows: list[int]) -> tuple[Rollout, Scored, torch.Tensor | None]:
    """This worker's share: the given rows, with the prompt columns that none of them uses left out."""
    f = {k: v[rows] if v is not None else None for k, v in all_rows.items()}
    used = f["prompt_mask"].any(0).nonzero()
    first = int(used[0]) if len(used) else f["prompt_mask"].shape[1] - 1
    f["prompt_ids"], f["prompt_mask"] = f["prompt_ids"][:, first:], f["prompt_mask"][:, first:]
    ro = Rollout(torch.cat([f["prompt_ids"], f["response_ids"]], 1), torch.cat([f["prompt_mask"], f["response_attn"]], 1),
                 f["response_mask"], f["prompt_ids"].shape[1], f["engine_logp"])
    return ro, Scored(ro, f["mask"], f["scores"], f["token_scores"]), f["baselines"]


def _all_gather(t: torch.Tensor, world: int) -> torch.Tensor:
    import torch.distributed as dist

    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return torch.cat(out)


def balance(ro: Rollout, sc: Scored, baselines, n: int, pad_id: int) -> tuple[Rollout, Scored, torch.Tensor | None, dict]:
    """Every worker calls this at the same point of its step (collectives over all of them). First each worker's
    widths and tokens per sample, from which every worker computes the same assignment; then, when groups move,
    everyone's samples (tensor all-gathers on the workers' own devices: NCCL on GPUs, Gloo on CPU)."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    widths = torch.tensor([ro.prompt_len, ro.response_mask.shape[1]], device=ro.input_ids.device)
    heads = _all_gather(torch.cat([widths, ro.attention_mask.sum(-1)]).to(torch.int64)[None], world).cpu()
    P, R = int(heads[:, 0].max()), int(heads[:, 1].max())
    groups = heads[:, 2:].reshape(-1, n)  # each sample's tokens (prompt + response), a row per prompt group
    parts, sampled = assign(workload(groups).sum(-1).tolist(), world), as_sampled(len(groups), world)
    tokens = lambda assignment: [int(groups[p].sum()) for p in assignment]
    metrics = seqlen_metrics(tokens(sampled), tokens(parts))
    if parts == sampled:
        return ro, sc, baselines, metrics
    own = padded(_named(ro, sc, baselines), P, R, pad_id)
    ints, floats = _pack(own)
    everything = _unpack(_all_gather(ints, world), _all_gather(floats, world), own)
    return (*take(everything, [g * n + j for g in parts[rank] for j in range(n)]), metrics)
