"""The actor's weights under the names and layout of the model's checkpoint, which is what vLLM's and SGLang's
loaders read. transformers 5 holds some architectures otherwise than their checkpoints do: a mixture of experts'
experts fused into one tensor per layer (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I])
where the checkpoint has one per expert (`mlp.experts.{e}.gate_proj.weight`, ...), Mixtral's `block_sparse_moe`
renamed `mlp`. transformers converts its checkpoints on load and reverts that on save_pretrained
(core_model_loading.revert_weight_conversion, over the model's conversion_mapping.py entries); the stream here is
that same reversion, so what an engine is handed is, name for name and tensor for tensor, what save_pretrained writes.

An architecture transformers holds as its checkpoint does (a dense model; gpt-oss, whose checkpoints hold the experts
fused) passes through untouched."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

# everything up to a block's index (`model.layers.3.`, `visual.blocks.0.`): the tensors one conversion may need
# together all lie in one block, so the stream is reverted a block at a time and never holds more than one
BLOCK = re.compile(r"^(.*?\.\d+)\.")


def meta_model(config) -> torch.nn.Module:
    """A weightless causal LM of `config`'s architecture: all transformers' conversion mapping needs."""
    from transformers import AutoModelForCausalLM

    remote = bool(getattr(config, "auto_map", None))  # its own code, which the user let its config load already
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=remote)


def may_convert(config) -> bool:
    """Whether transformers has a conversion for the architecture or a model within it (by model type or class
    name), asked without building a model: one that has none (a dense model) needs no model to pass through."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    configs = [config, *(getattr(config, key, None) for key in getattr(config, "sub_configs", {}))]
    keys = [getattr(c, "model_type", None) for c in configs if c is not None] + list(config.architectures or [])
    return any(k and get_checkpoint_conversion_mapping(k) is not None for k in keys)


class CheckpointLayout:
    """transformers' reverse weight conversion for one architecture, applied to a (name, tensor) stream in the
    model's in-memory layout (the actor's state dict, LoRA merged): the same stream in the checkpoint's layout.
    Reverted tensors are views of the ones given where transformers' ops allow (an expert's slice of the fused
    tensor), so the stream copies nothing an engine's loader does not."""

    def __init__(self, model: torch.nn.Module | None):
        """`model`: one of the architecture (a meta_model is enough; only its config and module tree are read), or
        None for one transformers converts nothing of (may_convert)."""
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange

        self.model = model
        # as save_pretrained reverts a model not read by from_pretrained: without legacy renamings or prefix changes
        conversions = get_model_conversion_mapping(model, add_legacy=False) if model is not None else []
        self.converts = any(not isinstance(c, PrefixChange) for c in conversions)

    @classmethod
    def of(cls, config) -> CheckpointLayout:
        """The layout of `config`'s architecture; a model of it is built (weightless) only where it may convert."""
        return cls(meta_model(config) if may_convert(config) else None)

    def __call__(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The stream in the checkpoint's layout, block by block, in order; every item of `tensors` is consumed."""
        if not self.converts:
            yield from tensors
            return
        block, held = None, {}
        for name, t in tensors:
            m = BLOCK.match(name)
            key = m.group(1) if m else name
            if held and key != block:
                yield from self._reverted(held)
                held = {}
            block, held[name] = key, t
        if held:
            yield from self._reverted(held)

    def _reverted(self, tensors: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        from transformers.core_model_loading import revert_weight_conversion

        yield from revert_weight_conversion(self.model, tensors).items()


def refusal(config) -> str | None:
    """Why the actor's weights cannot be handed over in the checkpoint's layout, or None: each of the architecture's
    conversions must have a reverse, and the reversion is run once over the weightless model's whole state dict, so an
    architecture transformers cannot revert is named at start-up, not at the first sync."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    if not may_convert(config):
        return None
    head = f"transformers {_version()} cannot convert {config.model_type}'s weights back to its checkpoint layout"
    try:
        model = meta_model(config)
        for conversion in get_model_conversion_mapping(model, add_legacy=False):
            try:
                conversion.reverse_transform()
            except (NotImplementedError, ValueError) as e:
                return f"{head} (its conversion {conversion!r} has no reverse{': ' + str(e) if str(e) else ''})"
        list(CheckpointLayout(model)(model.state_dict().items()))
    except Exception as e:  # noqa: BLE001 (any failure of the reversion is the refusal's reason)
        return f"{head} ({type(e).__name__}: {e})"
    return None


def _version() -> str:
    import transformers

    return transformers.__version__
