"""The attention implementation a model loads with: `model.override_config.attn_implementation`, which verl passes
to transformers' from_pretrained (model/loading.model_kwargs does the same; unset, transformers' default, sdpa, where
verl's default is flash_attention_2, which needs the flash-attn package). Checked at start-up, so that a name
transformers does not know, or a flash-attention kernel on a CPU run or without its package, is one line before any
worker starts instead of an error inside each."""

from __future__ import annotations

import importlib.util

# transformers 5's built-in implementations; "paged|..." and hub kernels ("org/repo") are passed through as named
KNOWN = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
# the package each flash-attention implementation imports, and how to get it
FLASH_PACKAGES = {
    "flash_attention_2": ("flash_attn", "pip install flash-attn"),
    "flash_attention_3": ("flash_attn_interface", "build flash-attention's hopper/ kernels"),
    "flash_attention_4": ("flash_attn.cute", "pip install flash-attn-4"),
}


def requested(override_config: dict) -> str | None:
    """The implementation a model section's override_config names, or None (transformers' default)."""
    return override_config.get("attn_implementation") or override_config.get("_attn_implementation")


def refusal(key: str, impl: str | None, device: str) -> str | None:
    """Why `impl` (set at `key`) cannot run on `device` (cpu | cuda | auto) here, or None."""
    if impl is None or impl.startswith("paged|") or "/" in impl:
        return None
    if impl not in KNOWN:
        return f"{key}={impl}: not an attention implementation transformers knows; use one of {', '.join(KNOWN)}"
    if impl not in FLASH_PACKAGES:
        return None
    if device == "cpu":
        return f"{key}={impl}: flash attention runs on GPUs only; use sdpa on a CPU run"
    module, fix = FLASH_PACKAGES[impl]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package (flash_attn of flash_attn.cute) is missing
        found = False
    if not found:
        return f"{key}={impl}: the {module} package is not installed here ({fix}), or use sdpa"
    return None
