"""The old-log-prob pass's sum of pi squared (model/forward.py token_outputs, with_sum_pi_squared): the softmax squared
of the model's own logits at each response position, padded and packed alike, beside the same log-probs."""

import pytest
import torch

from rlrig.trainer.model.forward import ForwardOptions, token_logprobs, token_outputs
from tests.unit.trainer.model.test_packing import batch, tiny  # noqa: F401  (the fixture)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_sum_pi_squared_is_the_softmax_squared_at_each_response_token(tiny, remove_padding):  # noqa: F811
    actor, _ = tiny
    ids, mask, P = batch(actor.config.vocab_size, [6, 4, 2, 5], [7, 3, 0, 5])
    filled = mask[:, P:].bool()
    with torch.no_grad():
        logp, _, spp = token_outputs(
            actor, ids, mask, P, ForwardOptions(remove_padding=remove_padding, with_sum_pi_squared=True)
        )
        logits = actor(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0)).logits
        expected = torch.softmax(logits[:, P - 1 : -1].float(), -1).pow(2).sum(-1)
        torch.testing.assert_close(
            logp, token_logprobs(actor, ids, mask, P, ForwardOptions(remove_padding=remove_padding))[0]
        )
    torch.testing.assert_close(spp[filled], expected[filled], atol=1e-5, rtol=1e-5)
    assert spp.shape == filled.shape and ((spp[filled] > 0) & (spp[filled] <= 1)).all()
    if remove_padding:
        assert (spp[~filled] == 0).all()
