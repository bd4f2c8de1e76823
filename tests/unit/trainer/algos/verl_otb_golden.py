"""Writes verl_otb_golden.json beside it: verl's optimal token baseline (and its tir_ variant), its sum of pi squared
and its variance_proxy/* metrics on seeded random inputs, which test_optimal_token_baseline.py compares rlrig's
with (the test needs neither verl nor its source).

verl commit b178a3cd56f58b2d502255daba591e92833930a7. verl is not installed here, so the script reads its source from
git and runs it by hand: run, at a new pin after updating VERL_COMMIT (verl_source.py),

    .venv/bin/python tests/unit/trainer/algos/verl_otb_golden.py /path/to/verl

(a bare git directory or a checkout). It executes, cut out by name with ast, core_algos.py's
compute_optimal_token_baseline_advantage and compute_multi_turn_optimal_token_baseline_advantage,
metric_utils.py's compute_variance_proxy_metrics and torch_functional.py's calculate_sum_pi_squared_from_logits,
masked_sum and masked_mean, with the little they import given to them (torch, numpy, defaultdict, a DataProto
holding a dict).

Cases, in float64 on [8, 10] batches of 3 prompts (groups of 4, 3 and 1) whose log-probs and sum_pi_squared come
from random logits over 6 tokens; some rows without tokens, some masks with holes (rejection sampling):
- otb / tir: the advantages and returns, with and without rollout IS weights, handle_zero_tail on and off;
- variance_proxy: the five metrics, with and without IS weights and a gradient norm;
- sum_pi_squared: calculate_sum_pi_squared_from_logits on random logits.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its neighbour
from verl_source import cut, git_show, write_fixture  # noqa: E402

OUT = Path(__file__).with_name("verl_otb_golden.json")
ROWS, COLS, VOCAB = 8, 10, 6
INDEX = [0, 0, 0, 0, 1, 1, 1, 2]
ESTIMATORS = [  # (which, rollout IS weights, handle_zero_tail, empty rows, holes in the mask)
    ("otb", False, False, False, False),
    ("otb", True, False, True, False),
    ("otb", False, True, False, False),
    ("otb", True, True, True, True),
    ("otb", False, False, False, True),
    ("tir", False, True, False, False),
    ("tir", True, True, True, False),
    ("tir", False, False, False, True),
    ("tir", True, True, True, True),
]
PROXY = [(False, None), (False, 0.7), (True, None), (True, 1.3)]  # (rollout IS weights, actor/grad_norm)


class DataProto:
    def __init__(self, batch: dict):
        self.batch = batch


def load_verl(repo: str) -> dict:
    """One namespace holding verl's functions, verl_F among them."""
    verl_f = type(sys)("verl_F")
    verl_f.torch = torch
    tf = {"masked_sum", "masked_mean", "calculate_sum_pi_squared_from_logits"}
    exec(cut(git_show(repo, "verl/utils/torch_functional.py"), tf), verl_f.__dict__)
    ns: dict = {"torch": torch, "np": np, "defaultdict": defaultdict, "verl_F": verl_f, "DataProto": DataProto}
    otb = {"compute_optimal_token_baseline_advantage", "compute_multi_turn_optimal_token_baseline_advantage"}
    exec(cut(git_show(repo, "verl/trainer/ppo/core_algos.py"), otb), ns)
    exec(cut(git_show(repo, "verl/trainer/ppo/metric_utils.py"), {"compute_variance_proxy_metrics"}), ns)
    ns["sum_pi_squared"] = verl_f.calculate_sum_pi_squared_from_logits
    return ns


def short(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t * 1e4) / 1e4  # four decimals: the fixture stays small, exact


def inputs(seed: int, is_weights: bool, empty: bool, holes: bool, sum_pi_squared) -> dict:
    """A response mask, token rewards (the score on the last token, some small dense ones), old log-probs and
    sum_pi_squared of sampled tokens under random logits, and (optionally) IS weights; [ROWS, COLS] in float64."""
    g = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(ROWS, COLS, VOCAB, generator=g, dtype=torch.float64)
    tokens = torch.multinomial(logits.softmax(-1).flatten(0, 1), 1, generator=g).view(ROWS, COLS)
    old = logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    lengths = torch.randint(1, COLS + 1, (ROWS,), generator=g)
    lengths[2] = COLS  # a group with one longest response
    mask = (torch.arange(COLS)[None] < lengths[:, None]).to(torch.float64)
    if empty:
        mask[3] = 0
    if holes:
        mask[0, 1:3] = 0
        mask[5, 0] = 0
    last = (mask * torch.arange(1, COLS + 1)).argmax(-1)
    rewards = torch.zeros(ROWS, COLS, dtype=torch.float64)
    rewards[torch.arange(ROWS), last] = torch.randint(0, 2, (ROWS,), generator=g).to(torch.float64)
    rewards += 0.1 * torch.randn(ROWS, COLS, generator=g, dtype=torch.float64) * (seed % 2)
    x = {"mask": mask, "rewards": short(rewards * mask), "old": short(old), "spp": short(sum_pi_squared(logits))}
    x["is_weights"] = short(0.5 + torch.rand(ROWS, COLS, generator=g, dtype=torch.float64)) if is_weights else None
    return x


def listed(d: dict) -> dict:
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in d.items()}


def main(repo: str) -> None:
    verl = load_verl(repo)
    fns = {
        "otb": verl["compute_optimal_token_baseline_advantage"],
        "tir": verl["compute_multi_turn_optimal_token_baseline_advantage"],
    }
    cases: dict[str, list] = {"estimator": [], "variance_proxy": [], "sum_pi_squared": []}
    for i, (which, is_w, zero_tail, empty, holes) in enumerate(ESTIMATORS):
        x = inputs(100 + i, is_w, empty, holes, verl["sum_pi_squared"])
        adv, ret = fns[which](
            x["rewards"], x["mask"], np.array(INDEX), x["old"], x["spp"], x["is_weights"], handle_zero_tail=zero_tail
        )
        cases["estimator"].append(
            {"estimator": which, "handle_zero_tail": zero_tail, "index": INDEX, **listed(x)}
            | {"advantages": adv.tolist(), "returns": ret.tolist()}
        )
    for i, (is_w, grad_norm) in enumerate(PROXY):
        x = inputs(200 + i, is_w, i % 2 == 1, False, verl["sum_pi_squared"])
        adv = fns["otb"](x["rewards"], x["mask"], np.array(INDEX), x["old"], x["spp"], x["is_weights"])[0]
        batch = {"old_log_probs": x["old"], "sum_pi_squared": x["spp"], "response_mask": x["mask"], "advantages": adv}
        if is_w:
            batch["rollout_is_weights"] = x["is_weights"]
        metrics = verl["compute_variance_proxy_metrics"](DataProto(batch), gradient_norm=grad_norm)
        cases["variance_proxy"].append(
            {"grad_norm": grad_norm, **listed(x), "advantages": adv.tolist(), "metrics": metrics}
        )
    g = torch.Generator().manual_seed(300)
    for scale in (0.5, 3.0, 20.0):
        logits = short(scale * torch.randn(4, 9, generator=g, dtype=torch.float64))
        cases["sum_pi_squared"].append(
            {"logits": logits.tolist(), "sum_pi_squared": verl["sum_pi_squared"](logits).tolist()}
        )
    write_fixture(OUT, cases)


if __name__ == "__main__":
    main(sys.argv[1])
