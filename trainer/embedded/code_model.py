"""The embedded code task: a product of two two-digit numbers to print with a Python program, scored by running the
program in a SandboxFusion service (`rlrig sandbox`) against the row's test case, as verl scores code rows.

A row is a `codecontests` row in verl's schema: the prompt `37*48`, the ground truth the test cases as JSON,
`{"inputs": [""], "outputs": ["1776"]}` (no stdin; the expected stdout). A response is a fenced Python program, the
block verl's code reward runs:

    ```python
    print(37*48)
    ```

The model's tokenizer is the embedded character-level one plus the fence's and print's pieces as single tokens. A
short supervised warm-up on programs of two kinds (half print the product worked out, which the tiny model cannot
do, so its digits are almost always wrong; half print the expression, which Python works out) leaves a model that
writes the fence every time and a right program about half the time; RL, paid by the sandbox's verdict, then teaches
it to let the program compute. Everything is seeded and built offline, like the embedded model.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from .tiny_model import build_tokenizer, cache_dir, save_atomically, supervised_step

VERSION = "tiny-code-v1"
DATA_SOURCE = "codecontests"  # one of verl's code sources: its default reward runs the row's test cases
OPEN, PRINT, CLOSE = "```python\n", "print(", ")\n```"
PIECES = [OPEN, PRINT, CLOSE]
WARMUP_STEPS = int(os.environ.get("RLRIG_CODE_WARMUP_STEPS", "1200"))
WARMUP_LR = 1e-3
DIRECT_SHARE = 0.5  # of the warm-up programs: the product written out, not computed


def model_dir() -> Path:
    return cache_dir().parent / VERSION


def build_code_tokenizer():
    from tokenizers import AddedToken

    tok = build_tokenizer()
    tok.add_tokens([AddedToken(p, special=False, normalized=False) for p in PIECES])
    return tok


def problem(rng: random.Random) -> tuple[int, int]:
    return rng.randint(10, 99), rng.randint(10, 99)


def program(a: int, b: int, computed: bool) -> str:
    """The fenced program that prints a*b: the expression for Python to work out, or the product written out."""
    return f"{OPEN}{PRINT}{f'{a}*{b}' if computed else a * b}{CLOSE}"


def cases_of(a: int, b: int) -> str:
    """verl's stdin/stdout test cases as the row's ground truth (JSON, as verl's code data sets store them)."""
    return json.dumps({"inputs": [""], "outputs": [str(a * b)]})


def code_rows(n: int, split: str, seed: int) -> list[dict]:
    """Products of two two-digit numbers in verl's schema, scored by running the response's program."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = problem(rng)
        q = f"{a}*{b}"
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": q}],
                "ability": "code",
                "reward_model": {"style": "rule", "ground_truth": cases_of(a, b)},
                "extra_info": {"split": split, "index": i, "question": q, "answer": program(a, b, True)},
            }
        )
    return rows


def warm_up(model, tokenizer, steps: int, seed: int = 0) -> None:
    """Supervised on prompt and program, the prompt left out of the loss (as RL will leave it)."""
    import torch

    rng = random.Random(seed + 3000)
    opt = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR)
    model.train()
    pad = tokenizer.pad_token_id
    for _ in range(steps):
        ids, labels = [], []
        for _ in range(32):
            a, b = problem(rng)
            p = tokenizer(f"{a}*{b}", add_special_tokens=False)["input_ids"]
            r = tokenizer(program(a, b, rng.random() >= DIRECT_SHARE) + tokenizer.eos_token, add_special_tokens=False)
            ids.append(p + r["input_ids"])
            labels.append([-100] * len(p) + r["input_ids"])
        supervised_step(model, opt, ids, labels, pad)
    model.eval()


def ensure_code_model(path: Path | None = None) -> str:
    """Build (once) and return the directory of the embedded code model."""
    from .tiny_model import build_model

    path = path or model_dir()
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return str(path)
    tok = build_code_tokenizer()
    model = build_model(tok)
    warm_up(model, tok, WARMUP_STEPS)
    return save_atomically(path, model, tok)


def task_files() -> tuple[str, str]:
    """The task's training and test rows, written once as parquet so the run reads them like any user's files."""
    from ..data.datasets import write_parquet

    root = cache_dir().parent / "data" / "code-products-v1"
    train, test = root / "train.parquet", root / "test.parquet"
    if not (train.is_file() and test.is_file()):
        root.mkdir(parents=True, exist_ok=True)
        for path, rows in ((train, code_rows(2048, "train", 1)), (test, code_rows(64, "test", 2))):
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            write_parquet(rows, tmp)
            os.replace(tmp, path)
    return str(train), str(test)
