"""The actor's full tensors as the engines take them (model/parallel.full_tensors): every state-dict entry once, a
tied LM head left out (the engines tie it to the embedding themselves, as a tied checkpoint has no lm_head.weight)."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlrig.trainer.model import parallel


def tiny(tied: bool) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(cfg)


@pytest.mark.parametrize("tied, skipped", [(True, {"lm_head.weight"}), (False, set())])
def test_a_tied_head_is_sent_once_under_the_embeddings_name(tied, skipped):
    model = tiny(tied)
    names = [name for name, _ in parallel.full_tensors(model)]
    assert set(model.state_dict()) - set(names) == skipped and len(names) == len(set(names))
    if tied:  # loading what was sent into an engine of the same config sets its head too
        engine = tiny(True)
        with torch.no_grad():
            for name, t in parallel.full_tensors(model):
                engine.state_dict()[name].copy_(t)
        assert torch.equal(engine.lm_head.weight, model.lm_head.weight)
