"""Names that differ between the transformers releases rlrig supports, read once from the installed one."""

from __future__ import annotations

import inspect

from transformers import GenerationMixin

# transformers renamed generate's and the models' key/value cache argument from past_key_values to cache (the old
# name warns on every call until its removal): the name this transformers takes
_GENERATE_TAKES = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
CACHE_ARG = "cache" if "cache" in _GENERATE_TAKES else "past_key_values"
# both spellings, for code that clears whichever a decoder layer was handed
CACHE_ARGS = ("cache", "past_key_values")
