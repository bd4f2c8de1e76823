"""GRPO (and Dr.GRPO with norm_adv_by_std_in_grpo=False): each sample against its prompt's group."""

from __future__ import annotations

import torch

from .registry import AdvantageInput, register

EPS = 1e-6


def group_ids(index) -> list:
    return list(index.tolist() if hasattr(index, "tolist") else index)


def group_centred(scores, index):
    # s_i - mean(s_group); a group of one keeps its score (verl's baseline 0 there)
    ids = group_ids(index)
    out = scores.clone()
    for g in set(ids):
        sel = [i for i, x in enumerate(ids) if x == g]
        if len(sel) > 1:
            out[sel] = scores[sel] - scores[sel].mean()
    return out


def grpo_advantages(scores, mask, index, norm_by_std: bool = True):
    # A_i = (s_i - mean(s_group)) / (std(s_group) + eps); Dr.GRPO (norm_by_std=False): A_i = s_i - mean(s_group)
    ids = group_ids(index)
    adv = torch.zeros_like(scores)
    for g in set(ids):
        sel = torch.tensor([i == g for i in ids], device=scores.device)
        s = scores[sel]
        if s.numel() == 1:
            mean, std = torch.tensor(0.0), torch.tensor(1.0)
        else:
            mean, std = s.mean(), s.std()
        adv[sel] = (s - mean) / (std + EPS) if norm_by_std else s - mean
    return adv.unsqueeze(-1) * mask, adv.unsqueeze(-1) * mask


@register("grpo")
def compute(x: AdvantageInput):
    return grpo_advantages(x.token_rewards.sum(-1), x.mask, x.index, x.norm_adv_by_std_in_grpo)
