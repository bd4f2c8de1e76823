"""Writes verl_agg_loss_golden.json beside it: verl's agg_loss as its engine workers call it (losses.ppo_loss
passing global_batch_info; verl 0.9 has no other workers), on seeded random micro batches, which
test_global_agg_loss.py compares rlrig's global_agg_loss with (the test needs neither verl nor its source).

verl 0.9.1 (VERL_RELEASE in verl_source.py). verl is not installed here, so the script reads its source from the
release's wheel, unpacked (verl_source.py says how), and runs it by hand:

    .venv/bin/python tests/unit/trainer/algos/verl_agg_loss_golden.py /tmp/verlwheel

It executes, cut out by name with ast, core_algos.py's agg_loss and torch_functional.py's masked_sum and masked_mean.

Cases, in float64: a mini batch of 8 rows x 10 columns on each of dp_size ranks, cut into micro batches of 2, 3 and 3
rows; some rows without tokens, some masks with holes; every aggregation mode; dp_size 1 and 2. Each case holds one
rank's micro batches and verl's loss for each, with the mini batch's token count over all ranks (batch_num_tokens)
and its sequence count (global_batch_size = ppo_mini_batch_size x n).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its neighbour
from verl_source import load_core_algos, write_fixture  # noqa: E402

OUT = Path(__file__).with_name("verl_agg_loss_golden.json")
ROWS, COLS, MICRO = 8, 10, [slice(0, 2), slice(2, 5), slice(5, 8)]
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def rank_batch(g: torch.Generator, holes: bool) -> tuple[torch.Tensor, torch.Tensor]:
    loss = torch.round(torch.randn(ROWS, COLS, generator=g, dtype=torch.float64) * 1e4) / 1e4
    lengths = torch.randint(1, COLS + 1, (ROWS,), generator=g)
    mask = (torch.arange(COLS)[None] < lengths[:, None]).to(torch.float64)
    if holes:
        mask[1] = 0
        mask[4, 0:2] = 0
    return loss, mask


def main(wheel: str) -> None:
    agg_loss = load_core_algos(wheel, {"agg_loss"})["agg_loss"]
    cases = []
    for i, (mode, dp_size, holes) in enumerate((m, d, h) for m in MODES for d in (1, 2) for h in (False, True)):
        g = torch.Generator().manual_seed(400 + i)
        ranks = [rank_batch(g, holes) for _ in range(dp_size)]
        tokens = int(sum(m.sum() for _, m in ranks))  # the engine's all-reduced loss_mask sum
        seqs = ROWS * dp_size
        loss, mask = ranks[0]
        info = {"dp_size": dp_size, "batch_num_tokens": tokens, "global_batch_size": seqs, "loss_scale_factor": None}
        micro = [agg_loss(loss[sl], mask[sl], mode, **info).item() for sl in MICRO]
        cases.append(
            {"mode": mode, "dp_size": dp_size, "tokens": tokens, "seqs": seqs, "loss": loss.tolist()}
            | {"mask": mask.tolist(), "micro": [[sl.start, sl.stop] for sl in MICRO], "verl": micro}
        )
    write_fixture(OUT, {"agg_loss": cases}, release=True)


if __name__ == "__main__":
    main(sys.argv[1])
