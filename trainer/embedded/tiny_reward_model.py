"""The embedded reward model: the embedded policy's network with a one-label head (the shape of verl's and
OpenRLHF's reward models), trained offline for a few seconds to score an arithmetic answer by whether it is
right, so its scores are graded (a logit), not the rule reward's 0/1. Seeded and cached like the policy.
"""

from __future__ import annotations

import random
from pathlib import Path

from .tiny_model import build_tokenizer, cache_dir, ensure_tiny_model, save_atomically

VERSION = "tiny-arith-rm-v2"  # v2: the embedded tokenizer's byte-level token names
STEPS, BATCH = 600, 32


def rm_cache_dir() -> Path:
    return cache_dir().with_name(VERSION)


def _samples(n: int, seed: int) -> tuple[list[str], list[float]]:
    """Prompt + answer texts, half with the right sum and half with a wrong one, and their labels."""
    from ..data.datasets import arithmetic_rows

    rng = random.Random(seed)
    texts, labels = [], []
    for r in arithmetic_rows(n, "reward-model", seed=seed):
        right = int(r["reward_model"]["ground_truth"])
        good = rng.random() < 0.5
        answer = right if good else rng.choice([x for x in range(19) if x != right])
        texts.append(r["prompt"][0]["content"] + f"#### {answer}")
        labels.append(1.0 if good else 0.0)
    return texts, labels


def build(policy_path: str, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    torch.manual_seed(seed)
    tok = build_tokenizer()
    tok.padding_side = "right"
    policy = AutoModelForCausalLM.from_pretrained(policy_path)
    conf = policy.config
    conf.num_labels, conf.classifier_dropout = 1, 0.0
    rm = AutoModelForTokenClassification.from_config(conf)
    rm.model.load_state_dict(policy.model.state_dict())  # start from what the policy knows of sums
    texts, labels = _samples(STEPS * BATCH, seed + 2000)
    opt = torch.optim.AdamW(rm.parameters(), lr=1e-3)
    rm.train()
    for s in range(STEPS):
        enc = tok(texts[s * BATCH : (s + 1) * BATCH], return_tensors="pt", padding=True)
        last = enc["attention_mask"].sum(-1) - 1
        logit = rm(**enc).logits[torch.arange(len(last)), last, 0]  # the score is read at the last token, as verl does
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logit, torch.tensor(labels[s * BATCH : (s + 1) * BATCH])
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    rm.eval()
    tok.padding_side = "left"
    return rm, tok


def ensure_tiny_reward_model(path: Path | None = None) -> str:
    path = path or rm_cache_dir()
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return str(path)
    return save_atomically(path, *build(ensure_tiny_model()))
