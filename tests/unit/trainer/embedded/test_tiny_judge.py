"""The embedded judge (`--preset judge`): on sums it never saw, it replies 1 to the right answer written as the
task asks and 0 to a wrong sum, the right sum without `#### `, the right answer changed by a character and noise,
read greedily as the preset asks it (its chat template, rlrig's judge function's template)."""

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlrig.trainer.data.datasets import arithmetic_rows
from rlrig.trainer.embedded.tiny_judge import TEMPLATE, edited, ensure_tiny_judge

# long: building the judge takes about 100 s once (tests/e2e/long_runs.sh); CI runs a judge's wiring with another model
pytestmark = [pytest.mark.process, pytest.mark.long]


@pytest.fixture(scope="module")
def judge():
    path = ensure_tiny_judge()
    return AutoTokenizer.from_pretrained(path, padding_side="left"), AutoModelForCausalLM.from_pretrained(path)


def replies(judge, pairs: list[tuple[str, str]]) -> list[str]:
    tok, model = judge
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": TEMPLATE.format(response=r, ground_truth=t)}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for r, t in pairs
    ]
    enc = tok(prompts, add_special_tokens=False, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=1, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1] :])


@pytest.mark.parametrize(
    ("kind", "answer", "verdict", "at_least"),
    [
        ("right", lambda s, rng: f"#### {s}", "1", 0.95),
        ("off by one or two", lambda s, rng: f"#### {abs(s + rng.choice([-2, -1, 1, 2]))}", "0", 0.8),
        ("any wrong sum", lambda s, rng: f"#### {rng.choice([x for x in range(19) if x != s])}", "0", 0.8),
        ("no ####", lambda s, rng: str(s), "0", 0.9),
        ("the right answer changed by a character", lambda s, rng: edited(f"#### {s}", rng), "0", 0.9),
        ("noise", lambda s, rng: "".join(rng.choice("0123456789+-*=# ") for _ in range(5)), "0", 0.9),
    ],
)
def test_the_judge_prefers_right_answers(judge, kind, answer, verdict, at_least):
    rng = random.Random(7)
    sums = [int(r["reward_model"]["ground_truth"]) for r in arithmetic_rows(200, "test", seed=12345)]
    pairs = [(answer(s, rng), str(s)) for s in sums]
    pairs = [(a, t) for a, t in pairs if not (verdict == "0" and a == f"#### {t}")]  # noise that happens to be right
    got = replies(judge, pairs)
    share = sum(g == verdict for g in got) / len(got)
    assert share >= at_least, (kind, share)
