"""Why a worker that holds the rollout engine could not start where it runs, in one line, asked by its constructor
before it builds anything (workers/training_worker.py, rollout_worker.py): the engine, the model's layout for it,
and the features the model must support. The driver reads the answers first and ends the run at the first refusal
(driver/launch.py). Each check imports the model code it asks only once its feature is on."""

from __future__ import annotations

from ..model.micro_batches import sequence_parallel


def weightless(model_cfg, model_path: str):
    """The model with its config as the workers load it (model.override_config set), on the meta device: what the
    checks of its structure ask."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..model import loading

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(loading.model_kwargs(model_cfg, model_path)["config"])


def layout_refusal(model_cfg, model_path: str, engine_cls) -> str | None:
    """An engine whose loader reads checkpoints takes the actor's weights reverted to the checkpoint's layout by
    transformers' own conversion (model/checkpoint_names.py): an architecture it cannot revert is refused here, and
    a model the engine's loader cannot take the weights of (the engine's model_refusal)."""
    if not engine_cls.checkpoint_layout:
        return None
    from transformers import AutoConfig

    from ..model import checkpoint_names, loading

    config = AutoConfig.from_pretrained(model_path, **loading.load_kwargs(model_cfg))
    why = checkpoint_names.refusal(config)
    if why:
        return f"{why}, which {engine_cls.name} loads; use actor_rollout_ref.rollout.name=hf"
    return engine_cls.model_refusal(config)


def sequence_parallel_refusal(cfg, model_path: str) -> str | None:
    """Why the actor's or critic's model cannot split its attention heads over its sequence-parallel group."""
    a, c, sizes = cfg.actor_rollout_ref, cfg.critic, sequence_parallel(cfg)
    if all(size <= 1 for size in sizes.values()):
        return None
    from transformers import AutoConfig

    from ..model import loading, ulysses

    for key, size, path, model in (
        ("actor_rollout_ref.actor", sizes["actor"], model_path, a.model),
        ("critic", sizes["critic"], c.model.path or model_path, c.model if c.model.path else a.model),
    ):
        if size <= 1:
            continue
        impl = model.override_config.get("attn_implementation") or model.override_config.get("_attn_implementation")
        if impl and impl not in ulysses.SUPPORTED:
            return (
                f"{key}.ulysses_sequence_parallel_size={size}: attn_implementation={impl} (override_config) cannot "
                f"attend over a sequence-parallel group; use one of {', '.join(ulysses.SUPPORTED)}"
            )
        why = ulysses.head_refusal(AutoConfig.from_pretrained(path, **loading.load_kwargs(model)), size)
        if why:
            return f"{key}.ulysses_sequence_parallel_size={size}: {why}"
    return None


def fused_head_check(cfg, model_path: str) -> str | None:
    """model.use_fused_kernels: whether the actor's model (with its LoRA adapters, if any) can have its head fused,
    asked of a weightless copy."""
    a = cfg.actor_rollout_ref
    if not a.model.use_fused_kernels:
        return None
    from ..model import forward, lora

    model = weightless(a.model, model_path)
    if a.model.uses_lora:
        from peft import get_peft_model

        model = get_peft_model(model, lora.peft_config(a.model))
    why = forward.fused_head_refusal(model)
    return f"actor_rollout_ref.model.use_fused_kernels=True: {why}; set it False" if why else None


def liger_check(cfg, model_path: str, device: str) -> str | None:
    """model.use_liger, the actor's (and reference's) and the critic's: a GPU, liger-kernel installed and a model
    type Liger has kernels for (model/kernels.py)."""
    a, c = cfg.actor_rollout_ref, cfg.critic
    if not (a.model.use_liger or c.model.use_liger):
        return None
    from transformers import AutoConfig

    from ..model import kernels, loading

    for key, on, path, model in (
        ("actor_rollout_ref.model.use_liger", a.model.use_liger, model_path, a.model),
        (
            "critic.model.use_liger",
            c.model.use_liger and cfg.critic_in_use,
            c.model.path or model_path,
            c.model if c.model.path else a.model,
        ),
    ):
        if on:
            model_type = AutoConfig.from_pretrained(path, **loading.load_kwargs(model)).model_type
            why = kernels.liger_refusal(key, model_type, device)
            if why:
                return why
    return None


def moe_check(cfg, model_path: str, engine: str = "hf", device: str = "cpu") -> str | None:
    """An MoE actor's routers (model/moe.py), asked of a weightless copy: recorded by the update (the config's
    auxiliary loss, the expert-load metrics), they cannot be in forwards of shared prompts (actor.use_prefix_grouper);
    routing replay needs an MoE of a family it is built for, and R3 an engine that returns routed experts."""
    a = cfg.actor_rollout_ref
    replay, recorded = a.actor.router_replay.mode != "disabled", a.rollout.enable_rollout_routing_replay
    if not (a.actor.use_prefix_grouper or replay or recorded):
        return None
    from ..model import moe

    model = weightless(a.model, model_path)
    spec = moe.MoeSpec.of(model)
    recording = "actor_rollout_ref.rollout.enable_rollout_routing_replay=True"
    if replay or recorded:
        key = f"actor_rollout_ref.actor.router_replay.mode={a.actor.router_replay.mode}" if replay else recording
        why = "the model has no mixture-of-experts routers" if spec is None else spec.replay_refusal()
        if why:
            return f"{key}: {why}"
        return recording_refusal(recording, a.rollout, engine, device) if recorded else None
    if spec is None or not (spec.aux_coef or a.rollout.moe_load_balance_metrics_interval > 0):
        return None
    return (
        "actor_rollout_ref.actor.use_prefix_grouper=True: the forwards of shared prompts do not record an MoE's "
        "routers, which its auxiliary loss (output_router_logits) and rollout.moe_load_balance_metrics_interval "
        "need; set use_prefix_grouper=False"
    )


def expert_parallel_refusal(cfg, model_path: str, engine_cls) -> str | None:
    """fsdp_config.expert_parallel_size above 1 (the actor's, the reference's): a model whose fused experts split
    evenly over that many ranks, asked of a weightless copy, and an engine with weights of its own (one that
    generates with the actor's modules, hf's, would need a whole copy of them, which has no expert-parallel form)."""
    a = cfg.actor_rollout_ref
    sizes = {p: getattr(a, p).fsdp_config.expert_parallel_size for p in ("actor", "ref")}
    if all(size == 1 for size in sizes.values()):
        return None
    if engine_cls.generates_with_actor_module and sizes["actor"] > 1:
        return (
            f"actor_rollout_ref.actor.fsdp_config.expert_parallel_size={sizes['actor']}: the {engine_cls.name} engine "
            "generates with a whole copy of the actor's modules; use actor_rollout_ref.rollout.name=vllm or sglang"
        )
    from ..model import expert_parallel

    model = weightless(a.model, model_path)
    for role, size in sizes.items():
        why = expert_parallel.refusal(model, size) if size > 1 else None
        if why:
            return f"actor_rollout_ref.{role}.fsdp_config.expert_parallel_size={size}: {why}"
    return None


def recording_refusal(key: str, rollout, engine: str, device: str) -> str | None:
    """rollout.enable_rollout_routing_replay: an engine that returns each token's experts (vLLM's
    enable_return_routed_experts, SGLang's), where it can, with the `rollout` config it is given."""
    if engine == "hf":
        return (
            f"{key}: the hf engine does not return the experts it routed each token to; use "
            "actor_rollout_ref.rollout.name=vllm or sglang, or actor_rollout_ref.actor.router_replay.mode=R2 "
            "without it"
        )
    if engine == "vllm" and device == "cpu":  # vLLM's aux-output connector runs in Model Runner V2, which needs Triton
        return (
            f"{key}: vLLM returns routed experts only from its Model Runner V2, which needs Triton (a GPU); "
            "on CPU use actor_rollout_ref.actor.router_replay.mode=R2 without it"
        )
    if engine == "vllm" and not rollout.enable_prefix_caching:  # vLLM 0.32 config/vllm.py refuses it so, late
        return f"{key}: vLLM returns routed experts only with prefix caching; set rollout.enable_prefix_caching=True"
    if engine == "vllm" and rollout.tensor_model_parallel_size > 1:
        # vLLM 0.32 sets its routed-experts output up on the first tensor-parallel rank only, and the scheduler of
        # every other rank, each its own under the external launcher rlrig runs it with, fails on the missing output
        return (
            f"{key}: vLLM returns routed experts from one engine process only, and rlrig runs one a worker "
            f"(rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size}); use "
            "tensor_model_parallel_size=1, rollout.name=sglang, or "
            "actor_rollout_ref.actor.router_replay.mode=R2 without it"
        )
    return None


def batch_invariance_refusal(cfg, device: str, engine_cls) -> str | None:
    """rollout.full_determinism with vLLM in the training workers' own processes (hybrid_engine) on an Ampere or
    ROCm GPU: vLLM makes its matrix products batch invariant there by replacing PyTorch's own aten::mm, addmm,
    matmul and linear for the whole process (vLLM 0.32 model_executor/determinism/batch_invariant.py), so the
    training's forwards would run them too, and aten::linear's replacement has no backward (torch then raises
    "Could not run 'aten::linear_backward'"). On Hopper and later vLLM changes only split-k settings and its
    softmax, log_softmax, mean and bmm kernels, whose backward PyTorch's own formulas serve."""
    from .. import determinism

    a = cfg.actor_rollout_ref
    if engine_cls.name != "vllm" or device != "cuda" or not a.hybrid_engine or not determinism.engines_asked(cfg):
        return None
    import torch

    if torch.version.hip is None and torch.cuda.get_device_capability()[0] != 8:
        return None
    gpu = "a ROCm GPU" if torch.version.hip is not None else "an Ampere GPU (compute capability 8.x)"
    rm = "reward_model.rollout.full_determinism"
    key = "actor_rollout_ref.rollout.full_determinism" if a.rollout.full_determinism else rm
    return (
        f"{key}=True: on {gpu} vLLM replaces PyTorch's own matrix products in its process, which are the training's "
        "too here (the replaced linear has no backward); give the rollout engines a pool of their own "
        "(actor_rollout_ref.hybrid_engine=False) or set full_determinism=False"
    )


def start_refusal(cfg, model_path: str, device: str, engine_cls) -> str | None:
    """Why a worker that holds the rollout engine `engine_cls` (its rollout.name's class, which the worker chose once)
    could not start in this process (the engine; the model's heads under sequence parallelism, ...), in one line, or
    None."""
    a = cfg.actor_rollout_ref
    why = engine_cls.unavailable(device) or layout_refusal(a.model, model_path, engine_cls)
    if why:
        return f"actor_rollout_ref.rollout.name={a.rollout.name}: {why}"
    return (
        batch_invariance_refusal(cfg, device, engine_cls)
        or sequence_parallel_refusal(cfg, model_path)
        or fused_head_check(cfg, model_path)
        or liger_check(cfg, model_path, device)
        or moe_check(cfg, model_path, engine_cls.name, device)
        or expert_parallel_refusal(cfg, model_path, engine_cls)
        or teachers_tokenizer_refusal(cfg, model_path)
    )


def teachers_tokenizer_refusal(cfg, model_path: str) -> str | None:
    """Distillation: a teacher whose tokenizer is not the student's (workers/teacher.py)."""
    if not cfg.distillation.enabled:
        return None
    from .teacher import tokenizer_refusal

    return tokenizer_refusal(cfg, model_path)
