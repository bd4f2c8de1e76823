"""The weight each training worker's token means carry when the driver combines workers (metrics.reduce): its count
of the model's own tokens, as verl takes those means over the whole batch's response mask. With tool turns the
attention mask also holds the tool's tokens, which must not weigh."""

import pytest
import torch

from rlrig.trainer import metrics as M
from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.workers.step.metrics import batch_metrics

pytestmark = pytest.mark.process


def shard(response_mask: list[list[int]], attention: list[list[int]], advantages: list[list[float]]) -> StepBatch:
    b, r = len(response_mask), len(response_mask[0])
    prompt = torch.ones(b, 2, dtype=torch.long)
    return StepBatch(
        input_ids=torch.zeros(b, 2 + r, dtype=torch.long),
        attention_mask=torch.cat([prompt, torch.tensor(attention)], 1),
        response_mask=torch.tensor(response_mask),
        prompt_len=2,
        group=torch.arange(b),
        scores=torch.zeros(b),
        rewards=torch.zeros(b, r),
        advantages=torch.tensor(advantages),
    )


def test_token_means_of_two_workers_combine_as_one_mean_over_the_models_tokens():
    # worker 1: one sample, a model turn (2 tokens), a tool turn (3 tokens), a model turn (1 token)
    one = shard([[1, 1, 0, 0, 0, 1]], [[1, 1, 1, 1, 1, 1]], [[1.0, 1.0, 9.0, 9.0, 9.0, 1.0]])
    # worker 2: one single-turn sample of 2 tokens
    two = shard([[1, 1, 0, 0, 0, 0]], [[1, 1, 0, 0, 0, 0]], [[4.0, 4.0, 0.0, 0.0, 0.0, 0.0]])
    results = [batch_metrics(b, b.response_mask, 8, torch.device("cpu")) for b in (one, two)]
    assert [r[M.TOKENS] for r in results] == [3.0, 2.0]
    assert [r["response_length/mean"] for r in results] == [6.0, 2.0]  # lengths stay the attention mask's, as verl
    # verl's batch mean over the response mask: (1 + 1 + 1 + 4 + 4) / 5
    assert M.reduce(results)["critic/advantages/mean"] == (1 + 1 + 1 + 4 + 4) / 5
