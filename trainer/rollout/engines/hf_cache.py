"""The hf engine's key/value caches: built from the model's config, storing keys and values in the compute dtype, and
the name transformers' generate takes a cache under."""

from __future__ import annotations

import functools

import torch
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

from ...model.transformers_api import cache_arg

__all__ = ["CACHE_ARG", "new_cache", "repeatable"]

CACHE_ARG = cache_arg()  # this module is imported with the hf engine, which calls generate


def repeatable(cache) -> bool:
    """Whether every layer of the cache can be repeated for a prompt's samples (keys and values, not a recurrent
    state)."""
    return all(hasattr(layer, "batch_repeat_interleave") for layer in cache.layers)


class _StoresIn(CacheLayerMixin):  # a mixin of the layers' base: their layout, so a layer can take it
    """A cache layer that keeps keys and values in store_dtype. Under autocast the rotary embedding takes
    the dtype of the fp32 residual stream, so keys (and, concatenated with them, values) would be cached in
    fp32: twice the memory of a bf16 cache. Attention casts them to the autocast dtype in any case (SDPA and
    matmul are autocast ops), so storing them cast changes no number."""

    def update(self, key_states, value_states, *args, **kwargs):
        return super().update(key_states.to(self.store_dtype), value_states.to(self.store_dtype), *args, **kwargs)


@functools.cache
def _storing(layer_cls: type) -> type:
    return type(f"{layer_cls.__name__}Cast", (_StoresIn, layer_cls), {})


def new_cache(config, dtype: torch.dtype | None):
    """A cache built from the model's config (every layer's kind known before the forward), its key/value
    layers storing in `dtype` (None: as computed). Linear-attention layers keep their recurrent state as is."""
    cache = DynamicCache(config=config)
    if dtype is not None:
        for layer in cache.layers:
            if isinstance(layer, DynamicLayer):
                layer.__class__ = _storing(type(layer))
                layer.store_dtype = dtype
    return cache
