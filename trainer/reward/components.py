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
