"""Model and optimizer setup for one worker: the actor (trained, wrapped for data parallelism), the
frozen reference, the critic, and the full module a rollout engine generates with."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from . import activation_offload, compiled, kernels, lora, parallel, ulysses
from .loading import import_external_lib, model_kwargs
from .precision import Precision, cast_buffers, resolve


@dataclass
class Trainable:
    module: torch.nn.Module  # the model itself: state dicts, sync, gradient clipping
    train: torch.nn.Module  # what training forwards call (a DDP wrapper, or the FSDP-sharded module)
    opt: torch.optim.Optimizer
    precision: Precision
    checkpointing: bool  # gradient checkpointing is on (it acts in training mode only)
    optimizer_offload: bool  # the optimizer state lives in host memory between steps (model/offload.py)
    device: torch.device
    param_offload: bool = False  # the (sharded) weights live in host memory outside the phases that use them
    # model.enable_activation_offload: what the training forwards save goes to host memory (its byte count)
    activation_offload: activation_offload.Offloader | None = None


@dataclass
class Models:
    actor: Trainable
    ref: torch.nn.Module | None
    ref_precision: Precision | None
    ref_offload: bool  # the reference's weights live in host memory between its passes
    critic: Trainable | None
    gen_module: torch.nn.Module  # the actor itself, or under FSDP a full copy for an engine that generates with it
    gen_is_actor: bool = False  # the engine generates with the actor's own model: the live weights, nothing to sync
    ref_in_actor: bool = False  # LoRA: the reference is the actor with its adapters disabled (ref is None)


def set_checkpointing(module, on: bool) -> None:
    """Gradient checkpointing on or off. Non-reentrant: the variant that works under FSDP2 and with inputs that need
    no grad. transformers 5.2x names it activation checkpointing (the old name warns there); 5.19, which vLLM 0.32
    pins, has only the old one. It acts only in training mode, which the update sets."""
    # the recompute of a sequence-parallel layer attends over its group again (model/ulysses.py). Compiled blocks
    # (model/compiled.py, never sequence parallel) trace the checkpoint call, where torch.compile refuses such contexts
    compiled_blocks = any(b._compiled_call_impl is not None for b in parallel.blocks(module))
    kwargs = {"use_reentrant": False}
    if not compiled_blocks:
        kwargs["context_fn"] = ulysses.checkpoint_contexts
    if hasattr(module, "activation_checkpointing_enable"):
        if on:
            module.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            module.activation_checkpointing_disable()
    elif on:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        module.gradient_checkpointing_disable()


def trainable(module, device, precision: Precision, optim, model_cfg, fsdp_config) -> Trainable:
    """model_cfg: the model.* section (gradient checkpointing, activation offload)."""
    cast_buffers(module, precision)
    checkpointing = model_cfg.enable_gradient_checkpointing
    offloader = None
    if model_cfg.enable_activation_offload:
        # blocks checkpointed by activation_offload itself, whose inputs then go to host memory too
        offloader = activation_offload.enable(module, checkpointing)
    elif checkpointing:
        set_checkpointing(module, True)
    train = parallel.wrap(module, device, precision, fsdp_config)
    # FSDP2's offload policy holds the shards, their gradients and so the optimizer's state in host memory itself:
    # moving the module or the state would fight it, so verl turns its own param and optimizer offload off
    policy = precision.strategy == "fsdp" and fsdp_config.offload_policy
    # frozen weights (LoRA's base) get no optimizer state; on a GPU the fused kernel, one launch for every tensor
    # (the same update as the default, which launches a few per parameter group and step)
    opt = torch.optim.AdamW(
        [p for p in module.parameters() if p.requires_grad],
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        fused=device.type == "cuda" and not policy,
    )
    return Trainable(
        module,
        train,
        opt,
        precision,
        checkpointing,
        fsdp_config.optimizer_offload and not policy,
        device,
        fsdp_config.param_offload and not policy,
        offloader,
    )


def generation_copy(module: torch.nn.Module, prec: Precision) -> torch.nn.Module:
    """The full copy an engine generates with under FSDP, held in the compute dtype: the dtype FSDP's policy
    computes the actor's forwards in, at half an fp32 copy's memory (a 7B model: 15 GB instead of 30 on every
    GPU), and with it the engine's key/value cache. Its parameters are allocated empty, one by one, and filled by
    the engine's first weight sync (which the worker runs before any rollout), a tensor at a time: the actor is
    never copied in fp32. Buffers (rotary frequencies), small and not synced, are copied, in buffer_dtype."""
    dtype = prec.param_dtype if prec.mixed else None
    empty = {
        id(p): torch.nn.Parameter(torch.empty_like(p, dtype=dtype or p.dtype), requires_grad=p.requires_grad)
        for p in module.parameters()
    }
    gen = copy.deepcopy(module, memo=empty)  # the memo hands deepcopy each parameter's empty stand-in
    if prec.mixed:
        cast_buffers(gen, prec)
    return gen


def routers_tapped_by_config(module: torch.nn.Module) -> bool:
    """Whether the model's own config asks for its auxiliary loss (output_router_logits), which the update records
    with hooks on the routers that compiled blocks would not run (compiled.eager_block_reasons, for the keys a run
    sets): its blocks then stay eager, which rank 0 says once."""
    from . import moe

    spec = moe.MoeSpec.of(module)
    if spec is None or not spec.aux_coef:
        return False
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(
            "rlrig: actor_rollout_ref.actor.use_torch_compile=True: the decoder blocks run uncompiled with the MoE's "
            "auxiliary loss (output_router_logits in the model's config)",
            flush=True,
        )
    return True


def build(
    cfg, path: str, device: torch.device, needs_critic: bool, engine_needs_full_module: bool, remote_ref: bool = False
) -> Models:
    """remote_ref: the reference lives in its own pool (workers/ref_worker.py), not here; needs_critic is False where
    the critic does (workers/critic_worker.py)."""
    from transformers import AutoModelForCausalLM

    a = cfg.actor_rollout_ref
    strategy = a.actor.strategy
    import_external_lib(a.model)
    kw = model_kwargs(a.model, path)
    prec = resolve(a.actor.fsdp_config, device.type, strategy, "actor")
    module = AutoModelForCausalLM.from_pretrained(path, dtype=prec.model_dtype, **kw).to(device)
    if a.model.use_liger:
        kernels.apply_liger(module, "actor_rollout_ref.model.use_liger", device.type)
    # transformers' generate cannot run on a sharded module (ranks would step out of lockstep at EOS), so
    # under FSDP an engine that generates with the actor's module gets its own full copy, refreshed by sync_weights
    # (taken before LoRA, which changes the model in place: the copy takes merged weights)
    gen_module = generation_copy(module, prec) if strategy == "fsdp" and engine_needs_full_module else module
    gen_is_actor = engine_needs_full_module and gen_module is module
    with_lora = a.model.uses_lora
    if with_lora:
        module = lora.apply(module, a.model)
    compiled.choose_math(cfg, "actor", device.type)
    if compiled.blocks_compiled(cfg, "actor", device.type) and not routers_tapped_by_config(module):
        parallel.compile_blocks(module)
    actor = trainable(module, device, prec, a.actor.optim, a.model, a.actor.fsdp_config)
    ref = ref_prec = None
    rc = a.ref.fsdp_config
    # under FSDP2's offload policy the reference's shards stay in host memory by themselves (as trainable's)
    ref_offload = rc.param_offload and not (strategy == "fsdp" and rc.offload_policy)
    if cfg.ref_in_use and not remote_ref and not with_lora:
        ref, ref_prec = load_reference(cfg, path, device, strategy)
        if strategy == "fsdp":  # sharded where it computes, cast by its policy as the actor; offloaded after
            if compiled.blocks_compiled(cfg, "ref", device.type):
                parallel.compile_blocks(ref)
            parallel.fsdp_shard(
                ref,
                ref_prec.fsdp_policy(),
                rc.fsdp_size,
                rc.reshard_after_forward,
                rc.offload_policy,
                rc.expert_parallel_size,
            )
        if ref_offload:
            ref.to("cpu")
    critic = build_critic(cfg, path, device) if needs_critic else None
    return Models(actor, ref, ref_prec, ref_offload, critic, gen_module, gen_is_actor, cfg.ref_in_use and with_lora)


def load_reference(cfg, path: str, device: torch.device, strategy: str) -> tuple[torch.nn.Module, Precision]:
    """The frozen reference on `device` in eval mode, held in its precision (fp32 weights unless asked otherwise, as
    verl; it computes in the compute dtype, bf16 on GPU)."""
    from transformers import AutoModelForCausalLM

    a = cfg.actor_rollout_ref
    import_external_lib(a.model)
    prec = resolve(a.ref.fsdp_config, device.type, strategy, "ref")
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=prec.model_dtype, **model_kwargs(a.model, path))
    if a.model.use_liger:  # verl's reference is built from actor_rollout_ref.model too
        kernels.apply_liger(ref, "actor_rollout_ref.model.use_liger", device.type)
    ref.to(device).eval().requires_grad_(False)
    cast_buffers(ref, prec)
    compiled.choose_math(cfg, "ref", device.type)  # in a training worker the same as the actor's (validation)
    return ref, prec


def build_critic(cfg, path: str, device: torch.device) -> Trainable:
    """The value model, wrapped like the actor (critic.model.path, else the actor's model with a value head)."""
    from transformers import AutoModelForTokenClassification

    a, c = cfg.actor_rollout_ref, cfg.critic
    cprec = resolve(c.model.fsdp_config, device.type, a.actor.strategy, "critic")
    import_external_lib(c.model)
    # no dropout on the value head (transformers' default is 0.1), as verl sets it: the update runs in training mode
    cpath = c.model.path or path
    ckw = model_kwargs(c.model if c.model.path else a.model, cpath, classifier_dropout=0.0, num_labels=1)
    # the value head is new, drawn from its own seeded stream: the same head wherever the critic is built (a training
    # worker or its own pool), and the worker's stream (what it samples with) does not depend on where that is
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.trainer.seed)
        cmodule = AutoModelForTokenClassification.from_pretrained(cpath, dtype=cprec.model_dtype, **ckw).to(device)
    if c.model.use_liger:
        kernels.apply_liger(cmodule, "critic.model.use_liger", device.type)
    return trainable(cmodule, device, cprec, c.optim, c.model, c.model.fsdp_config)
