"""`actor_rollout_ref.actor.use_prefix_grouper` (verl's key, off by default): GRPO's n samples of a
prompt share its tokens, so the actor's and the reference's forwards (old log-probs, reference
log-probs, the update) compute each distinct prompt of a micro batch once, and every sample's response
attends to that one computation. verl's PrefixGrouper splits attention the same way (the prefix's
self-attention once, then each suffix over prefix + suffix); the numbers are those of the padded
forward, and the gradient of every sample flows back into its prompt's one forward.

Two forwards per micro batch, through any transformers decoder whose layers all keep plain keys and
values (no sliding window, no recurrent state): the distinct prompts [U, P], recording each layer's
keys and values; then the responses [B, R - 1] (the last token predicts nothing that is scored), with
their prompt's rows gathered by index as the cache they attend to. Under gradient checkpointing
transformers drops a cache from a checkpointed layer, since its recompute would add to it a second
time; these caches are safe to keep (the recording one overwrites what it holds, the reading one
stores nothing), so each recompute sees what its forward saw."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .transformers_api import cache_arg

KEY = "actor_rollout_ref.actor.use_prefix_grouper"


class _RecordLayer(DynamicLayer):
    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states


class _ReadLayer(DynamicLayer):
    def update(self, key_states, value_states, *args, **kwargs):
        return torch.cat([self.keys, key_states], -2), torch.cat([self.values, value_states], -2)


def _config(model):
    return getattr(model, "module", model).config  # a DDP wrapper holds the model as .module


def refusal(config) -> str | None:
    """Why forwards of a model with this transformers config cannot share prompts, in one line, or None."""
    layers = DynamicCache(config=config).layers
    if all(type(layer) is DynamicLayer for layer in layers):
        return None
    kinds = sorted({type(layer).__name__ for layer in layers} - {"DynamicLayer"})
    return (
        f"{KEY}=True needs a model whose every layer attends over plain keys and values; this "
        f"{config.model_type} model has {', '.join(kinds)} layers: set it False"
    )


def check(model_path: str, load_kwargs: dict) -> None:
    """At start-up, before any worker loads the model."""
    from transformers import AutoConfig

    from ..errors import ConfigError

    if why := refusal(AutoConfig.from_pretrained(model_path, **load_kwargs)):
        raise ConfigError(why)


@contextmanager
def _caches_kept_under_checkpointing(model):
    # seconds to import, and forward.py (which the driver imports for the workers' classes) imports this module
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m in layers:
            del m._can_checkpoint_with_cache  # back to the class's own setting


def response_logits(model, input_ids, attention_mask, prompt_len) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The logits that predict the response tokens [B, R], as (logits, tokens) pieces along the response:
    the first token's from the prompts' forward, the rest from the responses'. Separate pieces, so the
    whole [B, R, vocab] logits are never copied into one tensor. Position ids respect left padding."""
    P, R = prompt_len, input_ids.shape[1] - prompt_len
    pos = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    # identical prompt rows (tokens and padding) are one prompt: its n samples, or a prompt drawn twice
    uniq, inv = torch.unique(torch.cat([input_ids[:, :P], attention_mask[:, :P]], 1), dim=0, return_inverse=True)
    record = DynamicCache(config=_config(model))
    record.layers = [_RecordLayer() for _ in record.layers]
    targets = input_ids[:, P:]
    with _caches_kept_under_checkpointing(model):
        out = model(
            input_ids=uniq[:, :P],
            attention_mask=uniq[:, P:],
            position_ids=(uniq[:, P:].cumsum(-1) - 1).clamp_min(0),
            **{cache_arg(): record},
            use_cache=False,
            logits_to_keep=1,
        ).logits
        pieces = [(out.index_select(0, inv), targets[:, :1])]
        if R > 1:
            read = DynamicCache(config=_config(model))
            read.layers = [_ReadLayer() for _ in record.layers]
            for layer, rec in zip(read.layers, record.layers):
                layer.lazy_initialization(rec.keys, rec.values)
                layer.keys, layer.values = rec.keys.index_select(0, inv), rec.values.index_select(0, inv)
            rest = model(
                input_ids=input_ids[:, P:-1],
                attention_mask=attention_mask[:, :-1],
                position_ids=pos[:, P:-1],
                **{cache_arg(): read},
                use_cache=False,
            ).logits
            pieces.append((rest, targets[:, 1:]))
    return pieces
