"""The embedded generative judge: a network of the embedded policy's kind (four layers) trained offline for about a
minute to read an answer and the reference sum in TEMPLATE (a reference-guided judge) and reply `1` when the answer
is written right (`#### ` and the sum) or `0`. It is the judge of `rlrig train --preset judge` (served by
reward/judge_server.py, asked by reward/judge_fn.py with TEMPLATE). Seeded and cached like the policy.
"""

from __future__ import annotations

import random
from pathlib import Path

from .tiny_model import ALPHABET, build_model, build_tokenizer, cache_dir, save_atomically, supervised_step

VERSION = "tiny-arith-judge-v3"  # v3: reference-guided, four layers, exact answers only
# the comparison is learned late (after ~1600 steps), by a network deeper than the policy's: about a minute on CPU
STEPS, BATCH, LAYERS, LR = 3000, 32, 4, 5e-4
# the judge's user message (reward/judge_fn.py's template), in the embedded tokenizer's alphabet
TEMPLATE = "{response},{ground_truth},,"  # a reference-guided judge: it compares the answer with the sum


def judge_cache_dir() -> Path:
    return cache_dir().with_name(VERSION)


def answers(right: int, rng: random.Random) -> tuple[str, int]:
    """A response to judge and its verdict: the right one (`#### ` and the sum) half the time; else a wrong sum
    (often off by a little, as the policy's mistakes are), the right one changed by a character (what a policy
    rewarded by this judge tries first: a reference-guided judge must ask for the answer exactly), or noise."""
    good = f"#### {right}"
    if rng.random() < 0.5:
        return good, 1
    kind = rng.random()
    if kind < 0.45:
        near = [x for x in (right - 2, right - 1, right + 1, right + 2) if 0 <= x <= 18]
        return f"#### {rng.choice(near if rng.random() < 0.5 else [x for x in range(19) if x != right])}", 0
    if kind < 0.9:
        return edited(good, rng), 0
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8))), 0


def edited(text: str, rng: random.Random) -> str:
    """`text` with one character inserted, deleted or replaced, or a few added at an end; never `text` itself."""
    while True:
        i, c = rng.randrange(len(text) + 1), rng.choice(ALPHABET)
        kind = rng.randrange(4)
        if kind == 0:
            out = text[:i] + c + text[i:]
        elif kind == 1 and i < len(text):
            out = text[:i] + text[i + 1 :]
        elif kind == 2 and i < len(text):
            out = text[:i] + c + text[i + 1 :]
        else:
            tail = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 3)))
            out = text + tail if rng.random() < 0.5 else tail + text
        if out != text:
            return out


def samples(n: int, seed: int, tok) -> tuple[list[list[int]], list[list[int]]]:
    """Token rows (the judge's prompt as its chat template renders it, then the verdict and the end token) and
    their labels: the verdict and the end token only."""
    from ..data.datasets import arithmetic_rows

    rng = random.Random(seed)
    ids, labels = [], []
    for r in arithmetic_rows(n, "judge", seed=seed):
        response, verdict = answers(int(r["reward_model"]["ground_truth"]), rng)
        truth = r["reward_model"]["ground_truth"]
        user = TEMPLATE.format(response=response, ground_truth=truth)
        text = tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]  # as the judge's server encodes it
        reply = tok(str(verdict), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        ids.append(list(prompt) + reply)
        labels.append([-100] * len(prompt) + reply)
    return ids, labels


def build(seed: int = 0):
    import torch

    torch.manual_seed(seed)
    tok = build_tokenizer()
    judge = build_model(tok, seed, layers=LAYERS)
    ids, labels = samples(STEPS * BATCH, seed + 3000, tok)
    opt = torch.optim.AdamW(judge.parameters(), lr=LR)
    judge.train()
    for s in range(STEPS):
        part = slice(s * BATCH, (s + 1) * BATCH)
        supervised_step(judge, opt, ids[part], labels[part], tok.pad_token_id)
    judge.eval()
    return judge, tok


def ensure_tiny_judge(path: Path | None = None) -> str:
    """Build (once) and return the directory of the embedded judge."""
    path = path or judge_cache_dir()
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return str(path)
    return save_atomically(path, *build())
