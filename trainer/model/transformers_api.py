"""Names that differ between the transformers releases rlrig supports, read once from the installed one."""

from __future__ import annotations

import functools
import inspect

# both spellings of the key/value cache argument, for code that clears whichever a decoder layer was handed
CACHE_ARGS = ("cache", "past_key_values")


@functools.cache
def cache_arg() -> str:
    """The name this transformers' generate and models take a key/value cache under: transformers renamed it from
    past_key_values to cache (the old name warns on every call until its removal). Read at first use, not at
    import: transformers' generation module costs seconds to import, and the driver imports the model modules
    for the workers' classes alone."""
    from transformers import GenerationMixin

    takes = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return "cache" if "cache" in takes else "past_key_values"
