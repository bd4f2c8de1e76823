"""The reward components GDPO normalizes one by one (algorithm.gdpo_reward_keys): fields a reward function returns
beside its score, as verl 0.9 reads them from its reward_extra_info."""

from __future__ import annotations

import torch


def reward_components(fields: list[dict], keys: list[str], device) -> torch.Tensor:
    """[B, K]: each sample's value of each key, in the keys' order. A key a sample's fields lack, or a value that is
    no number, stops the step naming the key and what the function returned (verl asserts the same)."""
    rows = []
    for f in fields:
        missing = [k for k in keys if k not in f]
        if missing:
            raise RuntimeError(
                f"algorithm.gdpo_reward_keys: {missing[0]!r} is not among the reward function's fields "
                f"({', '.join(sorted(f)) or 'none'}); make compute_score return a dict holding it"
            )
        try:
            rows.append([float(f[k]) for k in keys])
        except (TypeError, ValueError):
            bad = next(k for k in keys if not _number(f[k]))
            raise RuntimeError(
                f"algorithm.gdpo_reward_keys: the reward function's field {bad!r} is {f[bad]!r}, not a number"
            ) from None
    return torch.tensor(rows, dtype=torch.float32, device=device).reshape(len(fields), len(keys))


def _number(v) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def component_metrics(components: torch.Tensor, keys: list[str], batch_sum) -> dict:
    """verl's gdpo/<key>/{mean,std,max,min} over the whole batch: mean and std (numpy's, the population's) from
    sums over every worker (`batch_sum`, a collective), so each worker reports the batch's; max and min are this
    worker's, which metrics.py takes the largest and smallest of."""
    c = components.double()
    count = torch.full((c.shape[1],), float(len(c)), dtype=c.dtype, device=c.device)
    n, total, squares = batch_sum(torch.stack([count, c.sum(0), (c * c).sum(0)]))
    mean = total / n.clamp_min(1)
    std = (squares / n.clamp_min(1) - mean**2).clamp_min(0).sqrt()
    out = {}
    for i, key in enumerate(keys):
        out |= {
            f"gdpo/{key}/mean": mean[i].item(),
            f"gdpo/{key}/std": std[i].item(),
            f"gdpo/{key}/max": c[:, i].max().item(),
            f"gdpo/{key}/min": c[:, i].min().item(),
        }
    return out
