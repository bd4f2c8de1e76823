"""Tiny random mixtures of experts, built offline and cached: 2 layers, 8 experts, top-2, the embedded model's
character tokenizer, head_dim 64 (vLLM's CPU attention refuses smaller heads), saved in float32 (vLLM's CPU MoE
kernel runs float32 only here). Saved by save_pretrained, so their folders are in the checkpoint layout
(per-expert names) that vLLM reads."""

from __future__ import annotations

from pathlib import Path

FAMILIES = ("qwen3_moe", "mixtral")
VERSION = "tiny-moe-v2"


def config(family: str, tok):
    from transformers import MixtralConfig, Qwen3MoeConfig

    common = dict(
        vocab_size=len(tok),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,  # the data section's default prompt and response lengths
        num_experts_per_tok=2,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**common, intermediate_size=128, moe_intermediate_size=64, num_experts=8)
    if family == "mixtral":
        return MixtralConfig(**common, intermediate_size=64, num_local_experts=8)
    raise ValueError(f"no tiny MoE of family {family}; use one of {', '.join(FAMILIES)}")


def build(family: str, seed: int = 0):
    """(model, tokenizer): a random model of `family` in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config(family, tok), dtype=torch.float32), tok


def ensure(family: str, seed: int = 0) -> str:
    """Build (once) and return the folder of the tiny random model of `family`."""
    from rlrig.trainer.embedded.tiny_model import cache_dir, save_atomically

    path = Path(cache_dir()).parent / f"{VERSION}-{family}-{seed}"
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return str(path)
    model, tok = build(family, seed)
    return save_atomically(path, model, tok)
