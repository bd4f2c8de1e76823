"""The embedded model: a character-level tokenizer and a small Qwen2, built offline and cached.

A randomly initialised model practically never writes `#### <answer>`, so RL would have no signal.
A short supervised warm-up teaches the format and a little arithmetic; RL then improves on it.
Everything is seeded, so the cached model is the same on every machine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

VERSION = "tiny-arith-v2"  # v2: byte-level token names, so the saved tokenizer reloads as it was built
ALPHABET = list("0123456789+-*=#., ")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
WARMUP_STEPS = int(os.environ.get("RLRIG_TINY_WARMUP_STEPS", "120"))


def cache_dir() -> Path:
    return Path(os.environ.get("RLRIG_CACHE", Path.home() / ".cache" / "rlrig")) / VERSION


def char_vocab() -> dict[str, int]:
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    for ch in ALPHABET:
        vocab.setdefault(ch, len(vocab))
    return vocab


def build_tokenizer():
    return tokenizer_from_vocab(char_vocab())


def tokenizer_from_vocab(vocab: dict[str, int]):
    """A character-level tokenizer over `vocab` (text splits into single characters; longer entries are only
    ever sampled, never produced by encoding), with the embedded chat template.

    Its characters are named as a byte-level tokenizer names them (a space is `Ġ`): transformers loads any model of
    Qwen2's type with Qwen2's tokenizer class, whose byte-level pre-tokenizer would otherwise drop every space of the
    saved vocabulary. So the tokenizer a run loads from the model's folder encodes as the one built here."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)

    def named(token: str) -> str:
        return "".join(piece for piece, _ in byte_level.pre_tokenize_str(token)) if len(token) == 1 else token

    tok = Tokenizer(models.WordLevel(vocab={named(t): i for t, i in vocab.items()}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex("."), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_model(tokenizer, seed: int = 0, max_positions: int = 64, layers: int = 2):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    # head_dim 64: vLLM's CPU attention refuses smaller heads.
    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForCausalLM(cfg)


def supervised_step(model, opt, ids: list[list[int]], labels: list[list[int]], pad: int) -> None:
    """One optimizer step on token rows of unequal length: right-padded, the padding out of the loss (-100)."""
    import torch

    width = max(len(x) for x in ids)
    input_ids = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
    attn = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    lab = torch.tensor([x + [-100] * (width - len(x)) for x in labels])
    loss = model(input_ids=input_ids, attention_mask=attn, labels=lab).loss
    opt.zero_grad()
    loss.backward()
    opt.step()


def warm_up(model, tokenizer, steps: int, seed: int = 0) -> None:
    import torch

    from ..data.datasets import arithmetic_rows

    rows = arithmetic_rows(steps * 32, "warmup", seed=seed + 1000)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for s in range(steps):
        batch = rows[s * 32 : (s + 1) * 32]
        texts = [r["prompt"][0]["content"] + r["extra_info"]["answer"] + tokenizer.eos_token for r in batch]
        enc = tokenizer(texts, return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def ensure_tiny_model(path: Path | None = None) -> str:
    """Build (once) and return the directory of the embedded model."""
    path = path or cache_dir()
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return str(path)
    tok = build_tokenizer()
    model = build_model(tok)
    warm_up(model, tok, WARMUP_STEPS)
    return save_atomically(path, model, tok)


def save_atomically(path: Path, model, tok) -> str:
    from transformers.utils import logging

    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # save_pretrained draws a "Writing model shards" bar (transformers' logging.tqdm) and takes no argument to leave
    # it out; for one small shard written at a run's start it is noise, so the bar is off while it writes
    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        model.save_pretrained(tmp)
    finally:
        if shown:
            logging.enable_progress_bar()
    tok.save_pretrained(tmp)
    try:
        tmp.rename(path)  # atomic: a concurrent builder's copy is just as good
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(path)
