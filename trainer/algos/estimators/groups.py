"""The prompt groups of a batch: the samples that answer one prompt share an id (AdvantageInput.index). Found once
per call, for the estimators that compare a sample with its group (grpo, rloo, opo, gpg, grpo_passk, the optimal
token baseline)."""

from __future__ import annotations

import torch


def group_ids(index) -> list:
    """Each sample's group id as a Python value (index: a list, a numpy array or a tensor)."""
    return list(index.tolist() if hasattr(index, "tolist") else index)


def prompt_groups(index, device: torch.device | str | None = None) -> list[tuple[object, torch.Tensor]]:
    """[(id, rows)] for each group, in order of the id's first appearance; `rows` are the group's sample rows in
    ascending order (a long tensor on `device`), so `x[rows]` holds the group's values in batch order.

    One stable sort of the samples' group numbers, split by the groups' sizes. Each estimator then reduces a group
    with the same torch call on the same values in the same order as a per-group mask would select them, so its
    floats round as verl's per-group loops do (a scatter-add over the batch would sum in another order)."""
    number: dict = {}
    numbers = torch.tensor([number.setdefault(g, len(number)) for g in group_ids(index)], dtype=torch.long)
    rows = torch.argsort(numbers, stable=True).to(device)
    return list(zip(number, rows.split(torch.bincount(numbers, minlength=len(number)).tolist())))


def group_centred(scores: torch.Tensor, index) -> torch.Tensor:
    """s_i - mean(s_group); a group of one keeps its score (verl's baseline 0 there)."""
    out = scores.clone()
    for _, rows in prompt_groups(index, scores.device):
        if len(rows) > 1:
            out[rows] = scores[rows] - scores[rows].mean()
    return out
