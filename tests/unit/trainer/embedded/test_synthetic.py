"""The benchmark shapes: each builds the architecture it names, and the Qwen3-30B-A3B MoE and its dense comparator
have the same active parameters (what bench/gpu_step.py compares them by)."""

from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlrig.trainer.embedded.synthetic import (
    QWEN2_0_5B,
    QWEN2_5_7B,
    QWEN3_30B_A3B,
    QWEN3_30B_A3B_DENSE,
    config_of,
    wide_tokenizer,
)


def one_layer(shape):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config_of(replace(shape, num_hidden_layers=1), wide_tokenizer(512)))


@pytest.mark.parametrize(
    "shape, model_type",
    [(QWEN2_0_5B, "qwen2"), (QWEN2_5_7B, "qwen2"), (QWEN3_30B_A3B, "qwen3_moe"), (QWEN3_30B_A3B_DENSE, "qwen3")],
)
def test_each_shape_builds_its_architecture(shape, model_type):
    model = one_layer(shape)
    assert model.config.model_type == model_type
    assert model.config.hidden_size == shape.hidden_size and model.config.vocab_size == shape.vocab_size


def test_the_moe_and_its_dense_comparator_have_the_same_active_parameters():
    moe, dense = one_layer(QWEN3_30B_A3B), one_layer(QWEN3_30B_A3B_DENSE)
    experts = sum(p.numel() for name, p in moe.named_parameters() if ".experts." in name)
    s = QWEN3_30B_A3B
    active = (
        sum(p.numel() for p in moe.parameters()) - experts * (s.num_experts - s.num_experts_per_tok) // s.num_experts
    )
    router = s.num_experts * s.hidden_size  # the one matrix the dense model has no counterpart of
    assert active - router == sum(p.numel() for p in dense.parameters())
