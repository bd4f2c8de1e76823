"""Random-weight models of a real model's shape (vocabulary, width, depth), built offline and cached,
for benchmarks and tests: what matters there is the size of every tensor, not what the model says.

The tokenizer is the embedded character-level one, widened with filler tokens up to the vocabulary
size, so prompts tokenize as usual and any sampled id decodes.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from .tiny_model import cache_dir, char_vocab, tokenizer_from_vocab


@dataclass(frozen=True)
class Shape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = True
    # a mixture of experts (Qwen3-MoE) where num_experts > 0; head_dim set: Qwen3's attention (its own head width)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    head_dim: int | None = None


# Qwen2.5-0.5B's shape (494M parameters with tied embeddings)
QWEN2_0_5B = Shape(151936, 896, 4864, 24, 14, 2, 32768)
# Qwen2.5-7B's shape (7.6B parameters, untied embeddings)
QWEN2_5_7B = Shape(152064, 3584, 18944, 28, 28, 4, 32768, tie_word_embeddings=False)
# Qwen3-30B-A3B's shape (128 experts of width 768, 8 a token; 30.5B parameters, 3.3B active)
QWEN3_30B_A3B = Shape(
    151936, 2048, 6144, 48, 32, 4, 40960, False, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
    head_dim=128,
)  # fmt: skip
# the dense Qwen3 of the same active parameters: its MLP as wide as the 8 experts a token goes through
QWEN3_30B_A3B_DENSE = Shape(151936, 2048, 8 * 768, 48, 32, 4, 40960, False, head_dim=128)


def config_of(shape: Shape, tok):
    """The transformers config of a shape: Qwen3-MoE with experts, Qwen3 with a head width of its own, else Qwen2."""
    from transformers import Qwen2Config, Qwen3Config, Qwen3MoeConfig

    fields = {k: v for k, v in asdict(shape).items() if k in _DENSE_FIELDS}
    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    if shape.num_experts:
        moe = dict(
            num_experts=shape.num_experts,
            num_experts_per_tok=shape.num_experts_per_tok,
            moe_intermediate_size=shape.moe_intermediate_size,
            head_dim=shape.head_dim,
        )
        return Qwen3MoeConfig(**fields, **moe, **ids, rope_theta=1e6)
    if shape.head_dim:
        return Qwen3Config(**fields, head_dim=shape.head_dim, **ids, rope_theta=1e6)
    return Qwen2Config(**fields, **ids, rope_theta=1e6)


_DENSE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "tie_word_embeddings",
)


def wide_tokenizer(vocab_size: int):
    vocab = char_vocab()
    for i in range(len(vocab), vocab_size):
        vocab[f"<t{i}>"] = i
    return tokenizer_from_vocab(vocab)


def ensure_model(shape: Shape, seed: int = 0, dtype: str | None = None) -> str:
    """Build (once) and return the directory of a random model of this shape (config_of); `dtype` (a torch dtype's
    name): the weights saved in it, built on a GPU where there is one (a 7B shape's fp32 init takes minutes on a
    CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    # v2: the tokenizer's; a dense Qwen2's name leaves out the fields it does not have, so its cache stays found
    values = [v for k, v in asdict(shape).items() if k in _DENSE_FIELDS or v not in (0, None)]
    name = "synthetic-qwen2-v2-" + "-".join(str(v) for v in values)
    name += f"-{dtype}" if dtype else ""
    path = cache_dir().parent / name
    if (path / "config.json").is_file():
        return str(path)
    tok = wide_tokenizer(shape.vocab_size)
    torch.manual_seed(seed)
    cfg = config_of(shape, tok)
    tmp = Path(f"{path}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if dtype:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            AutoModelForCausalLM.from_config(cfg).to(getattr(torch, dtype)).save_pretrained(tmp)
    else:
        AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(path)
    except OSError:  # a concurrent builder's copy is just as good
        shutil.rmtree(tmp, ignore_errors=True)
    return str(path)
