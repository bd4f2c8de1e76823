"""Rollout engines by name (`actor_rollout_ref.rollout.name`). A new engine is a module in this
package with a RolloutEngine subclass, plus one line in ENGINES. `auto` is vLLM where it is installed,
else hf."""

from __future__ import annotations

import sys

from ...model.precision import tf32_kept
from .base import (
    GREEDY,
    EngineContext,
    EngineNotInstalled,
    EngineUnavailable,
    Rollout,
    RolloutEngine,
    Sampling,
    installed_release,
)
from .hf_engine import HFRollout
from .sglang_engine import SGLangRollout
from .vllm_engine import VLLMRollout

ENGINES: dict[str, type[RolloutEngine]] = {e.name: e for e in (HFRollout, VLLMRollout, SGLangRollout)}
AUTO = "auto"
NAMES = (*ENGINES, AUTO)

__all__ = [
    "ENGINES",
    "GREEDY",
    "NAMES",
    "EngineContext",
    "EngineNotInstalled",
    "EngineUnavailable",
    "Rollout",
    "RolloutEngine",
    "Sampling",
    "engine_class",
    "installed_release",
    "make_engine",
]


def engine_class(name: str) -> type[RolloutEngine]:
    """The class behind a configured name; for `auto`, which of vLLM and hf. Only vLLM's absence makes
    auto choose hf: an installed vLLM that fails to start is an error with its own cause."""
    if name != AUTO:
        return ENGINES[name]
    if installed_release(VLLMRollout.package[0]) is None:  # asked without the import, which the engine makes
        print("rlrig: rollout engine auto -> hf: vLLM is not installed", file=sys.stderr, flush=True)
        return HFRollout
    return VLLMRollout


def make_engine(cls: type[RolloutEngine], ctx: EngineContext) -> RolloutEngine:
    """The engine built from `ctx`; its EngineUnavailable, with the fix, where it cannot run on ctx.device. The
    process's TF32 settings are as they were before (an engine may set them for itself, vLLM does)."""
    why = cls.unavailable(ctx.device)
    if why:
        raise why
    with tf32_kept():
        return cls(ctx)
