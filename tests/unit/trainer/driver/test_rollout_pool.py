"""The driver's side of a rollout pool: the engines' batches joined in order, their prompts' padding widened, and
cut into the training workers' shares by sample."""

import pytest
import torch

from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.driver.rollout_pool import RolloutPool, merge
from rlrig.trainer.rollout.engines.base import pack_responses

PAD, EOS = 0, 9


def test_batches_of_different_prompt_widths_join_left_padded_in_order():
    a = pack_responses([[5, 6, 7]], 2, [[1, EOS], [2, 3]], [[-0.1, -0.2], [-0.3, -0.4]], 3, PAD, EOS)
    b = pack_responses([[8]], 2, [[4], [EOS]], [[-0.5], [-0.6]], 3, PAD, EOS)
    ro = merge([a, b], PAD)
    assert ro.prompt_len == 3
    assert ro.input_ids.tolist() == [
        [5, 6, 7, 1, EOS, PAD],
        [5, 6, 7, 2, 3, PAD],
        [PAD, PAD, 8, 4, PAD, PAD],
        [PAD, PAD, 8, EOS, PAD, PAD],
    ]
    assert ro.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0]] * 2 + [[0, 0, 1, 1, 0, 0]] * 2
    assert torch.equal(ro.response_mask, torch.cat([a.response_mask, b.response_mask]))
    assert torch.allclose(ro.engine_logp[2:, 0], torch.tensor([-0.5, -0.6]))


@pytest.mark.parametrize(
    "prompts, workers, firsts, samples",
    [
        (4, 2, [0, 4], [[1, 1, 2, 2], [3, 3, 4, 4]]),  # the prompts divide: each worker's groups whole
        # they do not (verl's dispatch by sample): prompt 2's samples on both workers, scored with its row on each
        (3, 2, [0, 3], [[1, 1, 2], [2, 3, 3]]),
    ],
)
def test_each_training_worker_gets_an_equal_share_cut_by_sample(prompts, workers, firsts, samples):
    ro = pack_responses([[p + 1] for p in range(prompts)], 2, [[i] for i in range(prompts * 2)], None, 1, PAD, EOS)
    rows = [{"prompt": p + 1} for p in range(prompts)]
    pool = RolloutPool([], [], 2, PAD)
    shares = pool.shares(ro, [{"num_turns": i} for i in range(prompts * 2)], rows, workers)
    assert [s.samples.input_ids[:, 0].tolist() for s in shares] == samples
    assert [[r["prompt"] for r in s.rows] for s in shares] == samples
    assert [s.first_sample for s in shares] == firsts
    # each sample's agent-loop fields go with it
    assert [[t["num_turns"] for t in s.turns] for s in shares] == [
        list(range(f, f + len(s.rows))) for f, s in zip(firsts, shares)
    ]
    # and the groups each share's samples answer count from the step's first prompt
    groups = [StepBatch.from_rollout(s.samples, 2, s.first_sample).group.tolist() for s in shares]
    assert groups == [[p - 1 for p in share] for share in samples]
