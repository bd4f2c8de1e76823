"""What runs through torch.compile, on CUDA only, decided once when a worker builds its models:

- the log-prob passes' per-chunk math (`actor_rollout_ref.{actor,ref}.fsdp_config.use_torch_compile`, verl 0.9's
  default True), as verl's FSDP engine compiles its entropy-from-logits function with `torch.compile(fn,
  dynamic=True)`: here the whole per-chunk math of model/chunked_logprobs.py, forward (the fp32 cast, logsumexp, the
  gathered log-prob, the entropy) and backward (the softmax recompute and the gradient), so the compiler may fuse
  the cast and the passes over a chunk instead of materialising each; the fused head's (`model.use_fused_kernels`,
  model/fused_logprobs.py) runs the same math on the logits of each chunk it computes;
- under FSDP, each decoder block (`actor_rollout_ref.{actor,ref}.use_torch_compile`), compiled in place before it
  is sharded, as torchtitan's apply_compile does (model/parallel.py).

On a CPU run compiling needs a C++ toolchain and takes longer than a whole default run, so everything runs eagerly
there, and the driver says so in one line at start-up (`start_notice`), as it does for the features the compiled
blocks are not run with.
"""

from __future__ import annotations

import functools

import torch

from . import chunked_logprobs
from .chunked_logprobs import EAGER, ChunkMath

MATH_KEYS = {
    "actor": "actor_rollout_ref.actor.fsdp_config.use_torch_compile",
    "ref": "actor_rollout_ref.ref.fsdp_config.use_torch_compile",
}
BLOCK_KEYS = {"actor": "actor_rollout_ref.actor.use_torch_compile", "ref": "actor_rollout_ref.ref.use_torch_compile"}


def compiled_math(backend: str = "inductor") -> ChunkMath:
    """chunked_logprobs' per-chunk math, each function through torch.compile with dynamic shapes (a chunk's token
    count changes from call to call); compiled at its first call."""
    return ChunkMath(
        forward=torch.compile(chunked_logprobs.logits_forward, dynamic=True, backend=backend),
        grad=torch.compile(chunked_logprobs.logits_grad, dynamic=True, backend=backend),
    )


@functools.cache
def _compiled() -> ChunkMath:
    return compiled_math()  # one per process: torch.compile's cache is per function object


def math_for(use_torch_compile: bool, device_type: str) -> ChunkMath:
    """The per-chunk math a worker on `device_type` runs: compiled where asked and on CUDA, else eager."""
    return _compiled() if use_torch_compile and device_type == "cuda" else EAGER


def choose_math(cfg, role: str, device_type: str) -> None:
    """This process's log-prob passes run `role`'s math (actor | ref) from now on (chunked_logprobs.use). A training
    worker's passes are the actor's and its reference's, which config validation holds to one value."""
    on = (cfg.actor_rollout_ref.actor if role == "actor" else cfg.actor_rollout_ref.ref).fsdp_config.use_torch_compile
    chunked_logprobs.use(math_for(on, device_type))


def block_compile_asked(cfg, role: str) -> bool:
    a = cfg.actor_rollout_ref
    ref = a.ref.use_torch_compile
    return a.actor.use_torch_compile if role == "actor" or ref is None else ref


def eager_block_reasons(cfg) -> list[str]:
    """The features whose hooks and patched attention the compiled blocks are not run with (they keep eager
    blocks)."""
    a = cfg.actor_rollout_ref
    features = (
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size>1", a.actor.ulysses_sequence_parallel_size > 1),
        ("actor_rollout_ref.actor.use_prefix_grouper", a.actor.use_prefix_grouper),
        ("actor_rollout_ref.model.enable_activation_offload", a.model.enable_activation_offload),
        ("LoRA (actor_rollout_ref.model.lora_rank)", a.model.uses_lora),
        # Liger's Triton kernels inside a compiled block: dynamo fails to trace them on torch 2.11 (CompilationError in
        # Liger's RMSNorm, measured on an H200) and falls back, and they are fused kernels already
        ("actor_rollout_ref.model.use_liger", a.model.use_liger),
        # an MoE's router hooks (model/moe.py RouterTap): torch.compile guards on no module's hooks
        # (skip_nnmodule_hook_guards), and the blocks of a model share one compiled code, so a block compiled in a
        # forward without the hooks (the reference's) would run every later forward without them
        ("actor_rollout_ref.actor.router_replay.mode", a.actor.router_replay.mode != "disabled"),
        (
            "actor_rollout_ref.rollout.moe_load_balance_metrics_interval",
            a.rollout.moe_load_balance_metrics_interval > 0,
        ),
        ("an MoE's auxiliary loss (output_router_logits)", bool(a.model.override_config.get("output_router_logits"))),
    )
    return [name for name, on in features if on]


def blocks_compiled(cfg, role: str, device_type: str) -> bool:
    """Whether `role`'s (actor | ref) decoder blocks are compiled before FSDP shards them."""
    return (
        device_type == "cuda"
        and cfg.actor_rollout_ref.actor.strategy == "fsdp"
        and block_compile_asked(cfg, role)
        and not eager_block_reasons(cfg)
    )


def start_notice(cfg) -> str | None:
    """The start-up line of a run (trainer.device resolved) where a use_torch_compile asks for compiling that does
    not happen: on the CPU, or blocks with a feature they keep eager for."""
    a = cfg.actor_rollout_ref
    asked = [MATH_KEYS["actor"]] if a.actor.fsdp_config.use_torch_compile else []
    if cfg.ref_in_use and a.ref.fsdp_config.use_torch_compile:
        asked.append(MATH_KEYS["ref"])
    blocks = [
        BLOCK_KEYS[r] for r in ("actor", "ref") if (r == "actor" or cfg.ref_in_use) and block_compile_asked(cfg, r)
    ]
    blocks = blocks if a.actor.strategy == "fsdp" else []  # DDP's blocks are not compiled, as verl's FSDP engine's
    if cfg.trainer.device == "cpu" and asked + blocks:
        parts = [w for w, on in (("the log-prob math", asked), ("the decoder blocks", blocks)) if on]
        what = " and ".join(parts) + (" run" if len(parts) > 1 else " runs")
        return (
            f"{', '.join(asked + blocks)}=True: this run is on CPU, where compiling needs a C++ toolchain and takes "
            f"longer than the run, so {what} uncompiled (set them False to silence this)"
        )
    reasons = eager_block_reasons(cfg)
    if cfg.trainer.device == "cuda" and blocks and reasons:
        return f"{', '.join(blocks)}=True: the decoder blocks run uncompiled with {', '.join(reasons)}"
    return None


def math_refusal(cfg) -> str | None:
    """The actor's and an in-worker reference's log-prob math differing: a training worker runs one."""
    a = cfg.actor_rollout_ref
    actor_on, ref_on = a.actor.fsdp_config.use_torch_compile, a.ref.fsdp_config.use_torch_compile
    if not cfg.ref_in_use or "actor_rollout_ref.ref" in cfg.own_pools() or actor_on == ref_on:
        return None
    return (
        f"{MATH_KEYS['ref']}={ref_on} and {MATH_KEYS['actor']}={actor_on}: the reference's log-probs are computed in "
        "the training workers, whose log-prob math is compiled for every pass or none; give both one value (or "
        "the reference a pool of its own, actor_rollout_ref.ref.enable_resource_pool=True)"
    )
