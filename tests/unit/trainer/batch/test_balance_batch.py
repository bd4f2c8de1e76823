"""trainer.balance_batch: the partition by hand, the re-padding of workers' samples, and two workers in a real Gloo
group trading whole groups so that each ends with about the same tokens."""

import os

import pytest
import torch

from rlrig.trainer.batch import balance as bb
from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.rollout.engines import Rollout
from tests.helpers import gloo_ranks

pytestmark = pytest.mark.process

PAD = 0


@pytest.mark.parametrize(
    "loads, parts, expect",
    [
        ([5, 1, 4, 2], 2, [[0, 1], [2, 3]]),  # 5 -> A, 4 -> B, 2 -> B (6), 1 -> A (6)
        ([9, 1, 1, 1], 2, [[0, 3], [1, 2]]),  # equal counts before totals: the 9 takes one 1, the last one left
        ([3, 3, 3, 3, 3, 3], 3, [[0, 3], [1, 4], [2, 5]]),
        ([7, 6, 5, 4, 3, 2], 3, [[0, 5], [1, 4], [2, 3]]),  # 9, 9, 9
        ([4, 8], 1, [[0, 1]]),
    ],
)
def test_partition_by_hand(loads, parts, expect):
    assert bb.partition(loads, parts) == expect


@pytest.mark.parametrize(
    "loads, parts, expect",
    [
        (
            [1, 1, 4, 2, 2, 2],
            2,
            [[0, 1, 2], [3, 4, 5]],
        ),  # as sampled 6 and 6; greedy would give 7 and 5 (4, 2, 1 | 2, 2, 1)
        ([5, 1, 4, 2], 2, [[0, 1], [2, 3]]),  # as sampled 6 and 6, greedy the same: a tie, so no trade
        ([5, 4, 2, 1], 2, [[0, 3], [1, 2]]),  # as sampled 9 and 3; greedy 6 and 6
        ([3, 3, 2, 2, 1, 1], 3, [[0, 4], [1, 5], [2, 3]]),  # greedy's 4, 4, 4 beats 6, 4, 2
        ([1, 2, 3, 3, 2, 1], 3, [[0, 2], [3, 5], [1, 4]]),  # as sampled 3, 6, 3; greedy 4, 4, 4 puts the 3s apart
    ],
)
def test_assign_trades_only_when_the_heaviest_worker_gets_lighter(loads, parts, expect):
    assert bb.assign(loads, parts) == expect


def test_workload_is_verls_estimate():
    # 24576 s + s^2
    assert bb.workload(torch.tensor([1, 100, 4096])).tolist() == [24577, 2467600, 117440512]


def test_metrics_say_tokens_per_worker_before_and_after():
    m = bb.seqlen_metrics([30, 10], [21, 19])
    assert m == {
        "global_seqlen/min": 10,
        "global_seqlen/max": 30,
        "global_seqlen/minmax_diff": 20,
        "global_seqlen/balanced_min": 19,
        "global_seqlen/balanced_max": 21,
        "global_seqlen/mean": 20.0,
    }


def _worker_samples(prompts: list[list[int]], responses: list[list[int]], n: int, seed: int, R: int = 9):
    """A worker's rollout as an engine returns it: prompt i's n samples at rows i*n.., left-padded prompts,
    responses right-padded to max_response_length (R), scores and engine log-probs that identify each sample."""
    P = max(map(len, prompts))
    ids, attn, rmask = [], [], []
    for i, resp in enumerate(responses):
        p = prompts[i // n]
        ids.append([PAD] * (P - len(p)) + p + resp + [PAD] * (R - len(resp)))
        attn.append([0] * (P - len(p)) + [1] * (len(p) + len(resp)) + [0] * (R - len(resp)))
        rmask.append([1] * len(resp) + [0] * (R - len(resp)))
    rmask = torch.tensor(rmask)
    logp = torch.randn(len(responses), R, generator=torch.Generator().manual_seed(seed)) * rmask
    ro = Rollout(torch.tensor(ids), torch.tensor(attn), rmask, P, logp)
    scores = torch.tensor([float(sum(r)) for r in responses])
    token_scores = torch.zeros(len(responses), R)
    token_scores[torch.arange(len(responses)), rmask.sum(-1) - 1] = scores
    return StepBatch.from_rollout(ro, n).replace(scores=scores, token_scores=token_scores, baselines=scores * 10)


def _as_samples(b: StepBatch) -> list[tuple]:
    """Each sample as what it is: its prompt and response tokens, score, baseline and engine log-probs."""
    out = []
    for i in range(len(b.input_ids)):
        prompt = b.input_ids[i, : b.prompt_len][b.attention_mask[i, : b.prompt_len].bool()].tolist()
        resp = b.input_ids[i, b.prompt_len :][b.response_mask[i].bool()].tolist()
        logp = tuple(round(x, 5) for x in b.engine_logp[i][b.response_mask[i].bool()].tolist())
        assert b.mask[i].sum() == len(resp) and b.token_scores[i].sum() == b.scores[i]
        out.append((tuple(prompt), tuple(resp), float(b.scores[i]), float(b.baselines[i]), logp))
    return out


# two workers of 2 prompts x 2 samples: worker 0's responses long, worker 1's short, their prompt widths differ
# (responses are as wide on every worker: the engines pad them to max_response_length)
N = 2
WORKERS = [
    ([[11, 12, 13], [14]], [[1] * 9, [2] * 8, [3] * 9, [4] * 7]),
    ([[15, 16], [17, 18]], [[5], [6, 6], [7], [8]]),
]


def _balance_worker(rank, world, out_dir):
    b2, metrics = bb.balance(_worker_samples(*WORKERS[rank], N, seed=rank), N, PAD)
    torch.save(
        {
            "samples": _as_samples(b2),
            "metrics": metrics,
            "prompt_len": b2.prompt_len,
            "dtypes": [t.dtype for t in (b2.input_ids, b2.attention_mask, b2.response_mask, b2.mask)],
        },
        os.path.join(out_dir, f"{rank}.pt"),
    )


def test_two_workers_trade_whole_groups_to_even_out_tokens(tmp_path):
    gloo_ranks.run(2, _balance_worker, str(tmp_path))
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    before = [_as_samples(_worker_samples(*WORKERS[r], N, seed=r)) for r in range(2)]
    # every sample once, unchanged, in whole groups of N, and equally many on each worker
    assert sorted(s for g in got for s in g["samples"]) == sorted(s for b in before for s in b)
    for g in got:
        assert len(g["samples"]) == 4
        assert all(g["samples"][i][0] == g["samples"][i + 1][0] for i in range(0, 4, N))
    # tokens (prompt + response) per worker: 3+9+3+8 + 1+9+1+7 = 41 and 2+1+2+2 + 2+1+2+1 = 13; group loads
    # 23, 18, 7, 6: 23 + 6 against 18 + 7
    tokens = [sum(len(s[0]) + len(s[1]) for s in g["samples"]) for g in got]
    assert sorted(tokens) == [25, 29]
    assert (
        got[0]["metrics"]
        == got[1]["metrics"]
        == {
            "global_seqlen/min": 13,
            "global_seqlen/max": 41,
            "global_seqlen/minmax_diff": 28,
            "global_seqlen/balanced_min": 25,
            "global_seqlen/balanced_max": 29,
            "global_seqlen/mean": 27.0,
        }
    )
    # the samples keep the tensors' dtypes, and each worker's prompts only the width its own need
    assert all(g["dtypes"] == [torch.int64, torch.int64, torch.int64, torch.float32] for g in got)
    assert sorted(g["prompt_len"] for g in got) == [2, 3]
