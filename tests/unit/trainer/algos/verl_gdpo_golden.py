"""Writes verl_gdpo_golden.json beside it: verl 0.9.1's GDPO advantages (compute_gdpo_outcome_advantage) on seeded
random inputs, which test_gdpo.py compares rlrig's with (the test needs neither verl nor its source).

verl 0.9.1 (VERL_RELEASE in verl_source.py), read from its wheel unpacked (verl_source.py says how) and run by hand:

    .venv/bin/python tests/unit/trainer/algos/verl_gdpo_golden.py /tmp/verlwheel

It executes, cut out by name with ast, core_algos.py's compute_gdpo_outcome_advantage and
compute_grpo_outcome_advantage with torch_functional.py's masked_sum, masked_mean, masked_var and masked_whiten.
Inputs in float64: 8 samples of 3 prompts (groups of 4, 3 and 1), 6 response tokens, each sample's K reward
components given as verl's reward loop gives them (a non-tensor field per key); some masks with holes (rejection
sampling); with and without gdpo_reward_weights and std normalization.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its neighbour
from verl_source import cut, wheel_show, write_fixture  # noqa: E402

OUT = Path(__file__).with_name("verl_gdpo_golden.json")
ROWS, PROMPT, COLS = 8, 2, 6
INDEX = [0, 0, 0, 0, 1, 1, 1, 2]
CASES = [  # (components, weights, norm_adv_by_std_in_grpo, holes in the mask)
    (2, None, True, False),
    (2, [1.0, 0.5], True, True),
    (3, [0.2, 1.0, 2.0], False, False),
    (3, None, False, True),
    (1, None, True, False),
]


def load_verl(root: str) -> dict:
    verl_f = type(ast)("verl_F")
    verl_f.torch = torch
    tf = {"masked_sum", "masked_mean", "masked_var", "masked_whiten"}
    exec(cut(wheel_show(root, "verl/utils/torch_functional.py"), tf), verl_f.__dict__)
    ns: dict = {"torch": torch, "np": np, "verl_F": verl_f, "Optional": Optional, "Any": Any}
    ns |= {"defaultdict": defaultdict, "AlgoConfig": dict}
    names = {"compute_gdpo_outcome_advantage", "compute_grpo_outcome_advantage"}
    exec(cut(wheel_show(root, "verl/trainer/ppo/core_algos.py"), names), ns)
    return ns


def main(root: str) -> None:
    ns = load_verl(root)
    cases = []
    for i, (k, weights, norm, holes) in enumerate(CASES):
        g = torch.Generator().manual_seed(900 + i)
        lengths = torch.randint(1, COLS + 1, (ROWS,), generator=g)
        attended = (torch.arange(COLS)[None] < lengths[:, None]).to(torch.float64)
        mask = attended.clone()
        if holes:
            mask[0, 0] = mask[5, lengths[5] - 1] = 0
        # scores of a few levels, so that some groups tie on a component
        comps = torch.randint(0, 3, (ROWS, k), generator=g).to(torch.float64) / 2
        comps += torch.round(torch.randn(ROWS, k, generator=g, dtype=torch.float64) * 1e3) / 1e4
        keys = [f"r{j}" for j in range(k)]
        config = {"gdpo_reward_keys": keys} | ({"gdpo_reward_weights": weights} if weights else {})
        batch = {
            "prompts": torch.ones(ROWS, PROMPT, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(ROWS, PROMPT), attended], 1).long(),
        }
        adv, _ = ns["compute_gdpo_outcome_advantage"](
            token_level_rewards=torch.zeros(ROWS, COLS, dtype=torch.float64),
            response_mask=mask,
            index=np.array(INDEX),
            norm_adv_by_std_in_grpo=norm,
            config=config,
            non_tensor_batch={key: comps[:, j].numpy().astype(np.float32) for j, key in enumerate(keys)},
            batch=batch,
        )
        cases.append(
            {
                # verl's reward loop hands the components as float32 (np.asarray(..., dtype=np.float32))
                "components": comps.to(torch.float32).to(torch.float64).tolist(),
                "weights": weights,
                "norm_adv_by_std_in_grpo": norm,
                "mask": mask.tolist(),
                "index": INDEX,
                "verl": adv.tolist(),
            }
        )
    write_fixture(OUT, {"gdpo": cases}, release=True)


if __name__ == "__main__":
    main(sys.argv[1])
