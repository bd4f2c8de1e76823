"""The rollout-and-score phase: sample responses, then score each with the reward function."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .engines import Rollout, RolloutEngine


@dataclass
class Scored:
    rollout: Rollout
    mask: torch.Tensor  # [B, R] float response mask
    scores: torch.Tensor  # [B] outcome scores
    token_scores: torch.Tensor  # [B, R]: the score on each response's last token, 0 elsewhere


def score(tokenizer, reward_fn, rows: list[dict], ro: Rollout, n: int) -> tuple[torch.Tensor, list[str]]:
    """The reward of each sample (prompt i's n samples at rows i*n .. i*n+n-1) and its decoded text."""
    texts = tokenizer.batch_decode(ro.input_ids[:, ro.prompt_len:].tolist(), skip_special_tokens=True)
    out = []
    for i, text in enumerate(texts):
        r = rows[i // n]
        out.append(float(reward_fn(r["data_source"], text, r["reward_model"]["ground_truth"], r.get("extra_info"))))
    return torch.tensor(out), texts


def generate(engine: RolloutEngine, rows: list[dict], n: int, device) -> Rollout:
    return engine.generate([r["input_ids"] for r in rows], n).to(device)


def score_rollout(tokenizer, reward_fn, rows: list[dict], ro: Rollout, n: int) -> Scored:
    scores = score(tokenizer, reward_fn, rows, ro, n)[0].to(ro.input_ids.device)
    mask = ro.response_mask.float()
    last = (mask.sum(-1).long() - 1).clamp_min(0)
    token_scores = torch.zeros_like(mask)
    token_scores[torch.arange(len(scores)), last] = scores  # outcome reward on the last response token
    return Scored(ro, mask, scores, token_scores)
