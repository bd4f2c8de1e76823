"""The driver's side of a rollout pool: the engines' batches joined in order, their prompts' padding widened."""

import torch

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


def test_each_training_worker_gets_its_prompts_samples():
    ro = pack_responses([[1], [2], [3], [4]], 2, [[i] for i in range(8)], None, 1, PAD, EOS)
    pool = RolloutPool([], [], 2, PAD, one_step=False)
    shares = pool.shares(ro, [{"num_turns": i} for i in range(8)], 2)  # each sample's agent-loop fields go with it
    assert [s.input_ids[:, 0].tolist() for s, _ in shares] == [[1, 1, 2, 2], [3, 3, 4, 4]]
    assert [[t["num_turns"] for t in turns] for _, turns in shares] == [[0, 1, 2, 3], [4, 5, 6, 7]]
