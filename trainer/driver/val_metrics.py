"""verl's validation metrics, computed as verl computes them (its metric_utils.process_validation_metrics and the
val-core/val-aux split of its trainer), so validation curves compare across the two.

Every sample contributes variables: `reward` (its score) and whatever else the reward function returned in a
dict (`score`, `acc`, `pred`, ...). Per prompt and variable, over its n samples: mean@n; for n > 1 also std@n and,
for k = 2, 4, 8, ... below n and k = n, best@k and worst@k (mean and std over 1000 bootstrap draws of k samples,
seed 42) and, where the function returned a `pred`, maj@k (the value of the most frequent pred). Each is then
averaged over the prompts of a data source. val-core holds the core variable's (`acc` if returned, else `reward`)
mean, best and maj at the largest k; everything else is val-aux.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from ..errors import ConfigError

BOOTSTRAPS, SEED = 1000, 42


def bootstrap(data: list, k: int, fns: list[Callable]) -> list[tuple[float, float]]:
    """(mean, std) of each fn over BOOTSTRAPS draws of k items with replacement; the draws are numpy's legacy
    generator seeded with SEED, the same indices verl's np.random.seed(42) + np.random.choice give."""
    idx = np.random.RandomState(SEED).choice(len(data), size=(BOOTSTRAPS, k), replace=True)
    arr = np.array(data, dtype=object)
    out = []
    for fn in fns:
        vals = np.array([fn(arr[row]) for row in idx], dtype=np.float64)
        out.append((float(vals.mean()), float(vals.std())))
    return out


def majority(votes) -> float:
    """The value of the first sample whose pred is the most frequent one (ties: the pred seen first)."""
    counts = Counter(v["pred"] for v in votes)
    top = max(counts, key=counts.get)
    return next(v["val"] for v in votes if v["pred"] == top)


def subset_sizes(n: int) -> list[int]:
    # 2, 4, 8, ... below n, then n itself
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n] if n > 1 else []


def per_prompt(samples: list[dict]) -> dict[str, dict[str, float]]:
    """variable -> metric -> value for one prompt's samples."""
    keys = set(samples[0])
    if any(set(s) != keys for s in samples):
        raise ConfigError(
            f"the reward function returned the fields {sorted(keys)} for one sample and "
            f"{sorted(next(set(s) for s in samples if set(s) != keys))} for another of the same prompt; "
            "return the same fields for every sample"
        )
    preds = [s["pred"] for s in samples] if "pred" in keys else None
    out = {}
    for var in samples[0]:
        vals = [s[var] for s in samples]
        if isinstance(vals[0], str):
            continue
        n = len(vals)
        m = {f"mean@{n}": float(np.mean(vals))}
        if n > 1:
            m[f"std@{n}"] = float(np.std(vals))
            for k in subset_sizes(n):
                (bm, bs), (wm, ws) = bootstrap(vals, k, [np.max, np.min])
                m.update({f"best@{k}/mean": bm, f"best@{k}/std": bs, f"worst@{k}/mean": wm, f"worst@{k}/std": ws})
                if preds is not None:
                    [(mm, ms)] = bootstrap([{"val": v, "pred": p} for v, p in zip(vals, preds)], k, [majority])
                    m.update({f"maj@{k}/mean": mm, f"maj@{k}/std": ms})
        out[var] = m
    return out


def validation_metrics(prompts: list[tuple[str, list[dict]]]) -> dict[str, float]:
    """(data source, the prompt's samples' variables) for every prompt -> verl's val-core/val-aux metrics."""
    by_source: dict[str, dict[str, dict[str, list[float]]]] = {}
    for source, samples in prompts:
        for var, metrics in per_prompt(samples).items():
            for name, value in metrics.items():
                by_source.setdefault(source, {}).setdefault(var, {}).setdefault(name, []).append(value)
    out = {}
    for source, variables in by_source.items():
        core = "acc" if "acc" in variables else "reward"
        for var, metrics in variables.items():
            largest = max(int(name.split("@")[-1].split("/")[0]) for name in metrics)
            for name, values in metrics.items():
                in_core = var == core and name.startswith(("mean", "maj", "best")) and f"@{largest}" in name
                out[f"{'val-core' if in_core else 'val-aux'}/{source}/{var}/{name}"] = float(np.mean(values))
    return out
