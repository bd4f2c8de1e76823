"""verl's engine workers' loss aggregation (trainer.use_legacy_worker_impl=disable; core_algos.global_agg_loss):
against values worked by hand, against verl 0.9.1's own agg_loss with global_batch_info (verl_agg_loss_golden.json,
written by verl_agg_loss_golden.py), and the property that defines it: a mini batch's loss does not depend on how
its rows are cut into micro batches."""

import json
from pathlib import Path

import pytest
import torch

from rlrig.trainer.algos.core_algos import Agg, GlobalBatch, agg_loss, global_agg_loss, with_mode

T = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
GOLDEN = json.loads(Path(__file__).with_name("verl_agg_loss_golden.json").read_text())

# two micro batches of one rank: [[1, -]] and [[2, 2], [4, -]] (- masked): 4 tokens, 3 sequences in the mini batch
LOSS_A, MASK_A = [[1.0, 9.0]], [[1.0, 0.0]]
LOSS_B, MASK_B = [[2.0, 2.0], [4.0, 9.0]], [[1.0, 1.0], [1.0, 0.0]]
BY_HAND = [
    # (mode, dp_size, micro batch A's loss, B's loss)
    # token-mean: sum / 4 tokens; the mini batch's loss 9/4 whichever micro batch a token is in
    ("token-mean", 1, 1 / 4, 8 / 4),
    # D = 2 ranks, 8 tokens over both: each rank's sum / 8 x 2, averaged over the ranks by the gradient all-reduce
    ("token-mean", 2, 1 / 8 * 2, 8 / 8 * 2),
    # seq-mean-token-sum: row sums 1 | 4, 4 over 3 sequences
    ("seq-mean-token-sum", 1, 1 / 3, 8 / 3),
    # seq-mean-token-mean: row means 1 | 2, 4 over 3 sequences
    ("seq-mean-token-mean", 1, 1 / 3, 6 / 3),
    # seq-mean-token-sum-norm: seq-mean-token-sum over T = 2 columns; D = 2, 6 sequences over both ranks
    ("seq-mean-token-sum-norm", 2, 1 / 6 * 2 / 2, 8 / 6 * 2 / 2),
    # token-sum: each rank's sum x D, which the gradient all-reduce's average turns into the sum over the ranks
    ("token-sum", 2, 1 * 2, 8 * 2),
]


@pytest.mark.parametrize("mode,dp_size,expect_a,expect_b", BY_HAND)
def test_by_hand(mode, dp_size, expect_a, expect_b):
    g = GlobalBatch(dp_size, tokens=4 * dp_size, seqs=3 * dp_size)
    assert global_agg_loss(T(LOSS_A), T(MASK_A), mode, g).item() == pytest.approx(expect_a)
    assert global_agg_loss(T(LOSS_B), T(MASK_B), mode, g).item() == pytest.approx(expect_b)
    # agg_loss takes the same through an Agg
    assert agg_loss(T(LOSS_A), T(MASK_A), Agg(mode, g)).item() == pytest.approx(expect_a)
    # SAPO's own mode keeps the global batch
    assert with_mode(Agg("token-mean", g), mode) == Agg(mode, g) and with_mode("token-mean", mode) == mode


def test_legacy_weighs_micro_batches_by_rows_not_tokens():
    """The legacy workers' micro batch means (1 and 8/3) times their shares of rows (1/3 and 2/3) give 19/9, not the
    9/4 of the whole mini batch's token mean: why verl's two implementations train differently."""
    legacy = agg_loss(T(LOSS_A), T(MASK_A), "token-mean") / 3 + agg_loss(T(LOSS_B), T(MASK_B), "token-mean") * 2 / 3
    assert legacy.item() == pytest.approx(19 / 9)
    whole = agg_loss(torch.cat([T(LOSS_A), T(LOSS_B)]), torch.cat([T(MASK_A), T(MASK_B)]), "token-mean")
    assert whole.item() == pytest.approx(9 / 4)


@pytest.mark.parametrize("case", GOLDEN["cases"]["agg_loss"], ids=lambda c: f"{c['mode']}-dp{c['dp_size']}")
def test_matches_verls_agg_loss_with_global_batch_info(case):
    g = GlobalBatch(case["dp_size"], case["tokens"], case["seqs"])
    loss, mask = T(case["loss"]), T(case["mask"])
    ours = [global_agg_loss(loss[a:b], mask[a:b], case["mode"], g).item() for a, b in case["micro"]]
    assert ours == pytest.approx(case["verl"], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize(
    "mode,per_row",
    [
        ("token-mean", None),
        # verl divides the seq-mean modes by every sequence of the mini batch, rows without tokens too
        ("seq-mean-token-sum", lambda loss, mask: (loss * mask).sum(-1)),
        ("seq-mean-token-mean", lambda loss, mask: (loss * mask).sum(-1) / mask.sum(-1).clamp_min(1)),
        ("seq-mean-token-sum-norm", lambda loss, mask: (loss * mask).sum(-1) / loss.shape[-1]),
        ("token-sum", lambda loss, mask: (loss * mask).sum(-1) * 12),
    ],
)
def test_the_micro_batches_add_up_to_the_mini_batchs_loss(mode, per_row):
    gen = torch.Generator().manual_seed(7)
    loss = torch.randn(12, 6, generator=gen, dtype=torch.float64)
    mask = (torch.arange(6)[None] < torch.randint(0, 7, (12, 1), generator=gen)).to(torch.float64)
    g = GlobalBatch(1, mask.sum().item(), 12)
    whole = agg_loss(loss, mask, mode) if per_row is None else per_row(loss, mask).sum() / 12
    for cuts in ([0, 12], [0, 1, 12], [0, 5, 6, 12], [0, 3, 6, 9, 12]):
        parts = sum(global_agg_loss(loss[a:b], mask[a:b], mode, g) for a, b in zip(cuts, cuts[1:]))
        assert parts.item() == pytest.approx(whole.item()), cuts
