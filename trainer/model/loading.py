"""from_pretrained's arguments from model.*, the tokenizer and model.external_lib: what the driver, the start-up checks
and the workers read a model's config and tokenizer with. No model code: the driver and the start-up probe import
this before (or without) transformers' model classes."""

from __future__ import annotations


def load_kwargs(model_cfg) -> dict:
    """from_pretrained arguments from model.*: a GGUF file, trust_remote_code."""
    gguf = getattr(model_cfg, "gguf_file", "")  # the reward model's config has none
    kw = {"gguf_file": gguf} if gguf else {}
    if model_cfg.trust_remote_code:
        kw["trust_remote_code"] = True
    return kw


def load_tokenizer(cfg, path: str):
    """The tokenizer the driver and every worker use: model.* load arguments, and data.trust_remote_code."""
    from transformers import AutoTokenizer

    kw = load_kwargs(cfg.actor_rollout_ref.model)
    if cfg.data.trust_remote_code:
        kw["trust_remote_code"] = True
    return AutoTokenizer.from_pretrained(path, **kw)


def model_kwargs(model_cfg, path: str, **overrides) -> dict:
    """from_pretrained arguments: load_kwargs and a config with model.override_config (and `overrides`) set on
    it before the weights load, as verl does (attributes a config does not define are set too). The attention
    implementation (override_config.attn_implementation) goes to from_pretrained itself, as verl passes it: set on the
    config, transformers never reads it."""
    from transformers import AutoConfig

    kw = load_kwargs(model_cfg)
    conf = AutoConfig.from_pretrained(path, **kw)
    attn = {}
    for k, v in {**overrides, **model_cfg.override_config}.items():
        if k in ATTN_KEYS:
            attn["attn_implementation"] = v
        else:
            setattr(conf, k, v)
    return {**kw, **attn, "config": conf}


ATTN_KEYS = ("attn_implementation", "_attn_implementation")


def import_external_lib(model_cfg) -> None:
    """model.external_lib: a module that registers its model classes with transformers when imported."""
    if model_cfg.external_lib:
        import importlib

        from ..errors import ConfigError

        try:
            importlib.import_module(model_cfg.external_lib)
        except ImportError as e:
            raise ConfigError(
                f"model.external_lib={model_cfg.external_lib} cannot be imported ({e}); install it"
            ) from None
