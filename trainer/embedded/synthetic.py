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


# Qwen2.5-0.5B's shape (494M parameters with tied embeddings)
QWEN2_0_5B = Shape(151936, 896, 4864, 24, 14, 2, 32768)
# Qwen2.5-7B's shape (7.6B parameters, untied embeddings)
QWEN2_5_7B = Shape(152064, 3584, 18944, 28, 28, 4, 32768, tie_word_embeddings=False)


def wide_tokenizer(vocab_size: int):
    vocab = char_vocab()
    for i in range(len(vocab), vocab_size):
        vocab[f"<t{i}>"] = i
    return tokenizer_from_vocab(vocab)


def ensure_model(shape: Shape, seed: int = 0, dtype: str | None = None) -> str:
    """Build (once) and return the directory of a random Qwen2 of this shape; `dtype` (a torch dtype's name):
    the weights saved in it, built on a GPU where there is one (a 7B shape's fp32 init takes minutes on a CPU)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    name = "synthetic-qwen2-v2-" + "-".join(str(v) for v in asdict(shape).values())  # v2: the tokenizer's
    name += f"-{dtype}" if dtype else ""
    path = cache_dir().parent / name
    if (path / "config.json").is_file():
        return str(path)
    tok = wide_tokenizer(shape.vocab_size)
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        **asdict(shape),
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        rope_theta=1e6,
    )
    tmp = Path(f"{path}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    if dtype:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            Qwen2ForCausalLM(cfg).to(getattr(torch, dtype)).save_pretrained(tmp)
    else:
        Qwen2ForCausalLM(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(path)
    except OSError:  # a concurrent builder's copy is just as good
        shutil.rmtree(tmp, ignore_errors=True)
    return str(path)
