"""A model's full state dict as a Hugging Face model directory (safetensors, config, tokenizer): what `rlrig
export` writes, and what a checkpoint holds under <role>/huggingface when save_contents names hf_model."""

from __future__ import annotations

from pathlib import Path


def write_hf_model(
    model_sd: dict, base: str, out: Path, gguf_file: str = "", lora: dict | None = None, value_head: bool = False
) -> None:
    """`model_sd` (the actor's, or with value_head the critic's) on the architecture of `base`, written to `out`.
    lora: the adapter's shape (lora.check); then `out` also holds lora_adapter/ and the weights are merged."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    kw = {"gguf_file": gguf_file} if gguf_file else {}
    conf = AutoConfig.from_pretrained(base, **kw)
    if value_head:  # the critic as model/build.py builds it: one label
        conf.num_labels = 1
    cls = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
    # the architecture from the base, the weights all from the checkpoint: from_config, since a model
    # read from GGUF stays marked as quantized and transformers refuses to save it
    model = cls.from_config(conf, dtype=torch.float32)
    if lora:
        # a LoRA run: the adapter as peft saves it (verl's lora_adapter/), and the model with it merged in
        from peft import LoraConfig, TaskType, get_peft_model

        from .lora import ADAPTER

        model = get_peft_model(model, LoraConfig(task_type=TaskType.CAUSAL_LM, bias="none", **lora))
        model.load_state_dict(model_sd)
        model.peft_config[ADAPTER].base_model_name_or_path = str(base)
        model.save_pretrained(out / "lora_adapter")
        model = model.merge_and_unload()
    else:
        model.load_state_dict(model_sd)
    model.save_pretrained(out)  # safetensors, transformers' default
    AutoTokenizer.from_pretrained(base, **kw).save_pretrained(out)
