"""Liger's kernels in a loaded model (`model.use_liger`), as verl's FSDP engine puts them there: Liger's own
`_apply_liger_kernel_to_instance` on the freshly loaded module, before LoRA and before any wrapping, with
verl's arguments (no fused linear cross-entropy, which would replace the causal LM's forward that rlrig's
log-prob passes read the logits from; SwiGLU on; Liger's defaults for the rest: RMSNorm, rotary embedding).

Liger's kernels are Triton's, GPU only. A run that cannot have them is refused in one line, before any model is
built (`liger_refusal`): on the CPU, without the liger extra installed, or with a model type Liger has no
kernels for (Liger itself would log that and change nothing). A failure inside Liger's patching is raised as it
is, never swallowed.
"""

from __future__ import annotations

import torch

from ..errors import ConfigError

INSTALL = "pip install 'rlrig[liger]'"
# verl 0.9's call (workers/engine/fsdp/transformer_impl.py)
VERL_ARGUMENTS = {"fused_linear_cross_entropy": False, "swiglu": True}


def _liger_models() -> dict:
    """Liger's table of model types to the function that patches them; ImportError without the extra."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return MODEL_TYPE_TO_APPLY_LIGER_FN


def liger_device_refusal(key: str, device_type: str) -> str | None:
    """`key`=True (a model section's use_liger) on a device other than CUDA, in one line, or None."""
    if device_type == "cuda":
        return None
    return (
        f"{key}=True: Liger's kernels are Triton kernels, GPU only, and this run is on {device_type}; set "
        f"{key}=False or run on a GPU (trainer.device=cuda)"
    )


def liger_refusal(key: str, model_type: str | None, device_type: str) -> str | None:
    """Why `key`=True (a model section's use_liger) cannot run here, in one line, or None: the device, Liger not
    installed, or `model_type` (the model's config.model_type) one Liger has no kernels for."""
    why = liger_device_refusal(key, device_type)
    if why:
        return why
    try:
        supported = _liger_models()
    except ImportError as e:
        return f"{key}=True: liger-kernel cannot be imported ({e}); {INSTALL}"
    if model_type not in supported:
        return (
            f"{key}=True: Liger has no kernels for model type {model_type!r} (it has {', '.join(sorted(supported))}); "
            f"set {key}=False"
        )
    return None


def apply_liger(module: torch.nn.Module, key: str, device_type: str) -> None:
    """Liger's kernels into `module` (a transformers model, loaded and not yet wrapped) in place, with verl's
    arguments; ConfigError (one line) where `liger_refusal` refuses. Liger's patching also replaces the model
    family's classes and functions in transformers' modeling module, so every model of that family built in this
    process afterwards has them too, as in verl."""
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    why = liger_refusal(key, model_type, device_type)
    if why:
        raise ConfigError(why)
    from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=module, **VERL_ARGUMENTS)
