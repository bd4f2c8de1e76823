"""verl's keys that rlrig does not take as they are: refused in one line saying so, accepted where they
change nothing for rlrig (said in `--print-config`), and rlrig's own additions.

The rule: every key rlrig accepts does what verl does with it; a verl key rlrig does not implement is
refused at start-up, never accepted and ignored.
"""

from __future__ import annotations

# Whole families of verl keys, by prefix, and single keys: what they are and what rlrig offers instead.
REFUSED_PREFIXES = {
    "reward_model.sandbox_fusion.": "verl's sandbox-fusion code execution is not in rlrig; score code with "
    "custom_reward_function.path/name",
    "reward_model.profiler.": "verl's profilers are not in rlrig; use ray_kwargs.timeline_json_file",
    "actor_rollout_ref.rollout.agent.": "verl's agent loop is not in rlrig; its rollout is single-turn",
    "global_profiler.": "verl's profilers are not in rlrig; use ray_kwargs.timeline_json_file for a Ray timeline",
    "actor_rollout_ref.actor.profiler.": "verl's profilers are not in rlrig; use ray_kwargs.timeline_json_file",
    "actor_rollout_ref.rollout.profiler.": "verl's profilers are not in rlrig; use ray_kwargs.timeline_json_file",
    "actor_rollout_ref.ref.profiler.": "verl's profilers are not in rlrig; use ray_kwargs.timeline_json_file",
    "critic.profiler.": "verl's profilers are not in rlrig; use ray_kwargs.timeline_json_file",
    "actor_rollout_ref.rollout.trace.": "verl's rollout tracing is not in rlrig",
}
REFUSED = {
    "actor_rollout_ref.hybrid_engine": "rlrig's rollout engines run inside the training workers (verl's hybrid "
    "engine, hybrid_engine=True); rollout on separate workers is not in rlrig",
    "actor_rollout_ref.rollout.multi_turn.enable": "verl's multi-turn and tool-calling rollout is not in rlrig; its "
    "rollout is single-turn",
    **{
        f"algorithm.rollout_correction.{k}": "of verl's rollout correction rlrig has the importance weights of the "
        "decoupled mode (algorithm.rollout_correction.rollout_is=token|sequence, rollout_is_threshold, "
        "rollout_is_batch_normalize), not rejection sampling or bypass mode"
        for k in ("rollout_rs", "rollout_rs_threshold", "bypass_mode", "loss_type")
    },
    "critic.model.lora_rank": "LoRA on the critic is not in rlrig; the critic trains all its weights (the actor's "
    "LoRA is actor_rollout_ref.model.lora_rank)",
    "critic.model.lora_alpha": "LoRA on the critic is not in rlrig (see critic.model.lora_rank)",
    "critic.model.target_modules": "LoRA on the critic is not in rlrig (see critic.model.lora_rank)",
    "critic.model.lora_adapter_path": "LoRA on the critic is not in rlrig (see critic.model.lora_rank)",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "sequence parallelism (Ulysses) is not in rlrig; each "
    "sequence stays on one GPU (use_dynamic_bsz bounds the tokens)",
    "critic.ulysses_sequence_parallel_size": "sequence parallelism (Ulysses) is not in rlrig; each sequence stays on "
    "one GPU",
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": "sequence parallelism (Ulysses) is not in rlrig",
    "reward_model.micro_batch_size": "verl's deprecated global micro batch; set reward_model.micro_batch_size_per_gpu",
    "reward_model.launch_reward_fn_async": "rlrig scores in the step, not asynchronously during the log-prob pass",
    "reward_model.ulysses_sequence_parallel_size": "sequence parallelism (Ulysses) is not in rlrig",
    "reward_model.reward_loop_source": "a reward-loop class of your own is not in rlrig; its reward loop scores "
    "with vLLM in pooling mode",
    "reward_model.reward_loop_module_path": "a reward-loop class of your own is not in rlrig; its reward loop scores "
    "with vLLM in pooling mode",
    "reward_model.reward_loop_class_name": "a reward-loop class of your own is not in rlrig; its reward loop scores "
    "with vLLM in pooling mode",
    "data.custom_cls.path": "custom dataset classes are not in rlrig; it reads verl's parquet schema",
    "data.custom_cls.name": "custom dataset classes are not in rlrig; it reads verl's parquet schema",
}
# A value rlrig accepts for a key it otherwise refuses: verl's default, which asks for nothing.
ACCEPTED_DEFAULTS = {
    # verl's rollout correction defaults: no rejection sampling, no bypass mode
    "algorithm.rollout_correction.rollout_rs": ("null", "None"),
    "algorithm.rollout_correction.rollout_rs_threshold": ("null", "None"),
    "algorithm.rollout_correction.bypass_mode": ("False", "false"),
    "algorithm.rollout_correction.loss_type": ("ppo_clip",),
    # verl's critic defaults: LoRA off
    "critic.model.lora_rank": ("0",),
    "critic.model.lora_alpha": ("16",),
    "critic.model.target_modules": ("all-linear",),
    "critic.model.lora_adapter_path": ("null", "None"),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": ("1",),
    "critic.ulysses_sequence_parallel_size": ("1",),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": ("1",),
    "reward_model.micro_batch_size": ("null", "None"),
    "reward_model.launch_reward_fn_async": ("False", "false"),
    "reward_model.ulysses_sequence_parallel_size": ("1",),
    "reward_model.reward_loop_source": ("register",),
    "reward_model.reward_loop_module_path": ("null", "None"),
    "reward_model.reward_loop_class_name": ("null", "None"),
    "reward_model.sandbox_fusion.url": ("null", "None"),
    "actor_rollout_ref.rollout.multi_turn.enable": ("False", "false"),
    # verl's default: the rollout engine inside the actor's workers, which is how rlrig always runs it
    "actor_rollout_ref.hybrid_engine": ("True", "true"),
}

# Keys of a verl feature that is off: verl reads them only when the feature is on, which rlrig refuses (above),
# so for rlrig as for verl they change nothing. Accepted and not stored.
INERT_PREFIXES = {
    "actor_rollout_ref.rollout.multi_turn.": "read by verl only with multi_turn.enable=True",
}

# Keys accepted because, for rlrig, they change nothing; `--print-config` lists them with the reason.
NO_EFFECT = {
    "actor_rollout_ref.rollout.mode": "verl runs every rollout through its async agent loop (sync is removed from "
    "verl); with multi_turn off that loop is its single_turn_agent, which samples "
    "each prompt once per rollout.n as rlrig's engines do; async and sync give the "
    "same single-turn rollout here, and what async adds beyond it (multi_turn, "
    "agent.*) is refused",
    "data.return_raw_chat": "rlrig applies the chat template itself on the driver; raw or templated, the engine gets "
    "the same tokens",
    "data.dataloader_num_workers": "rlrig reads the data set in the driver process",
    "data.filter_overlong_prompts_workers": "rlrig filters over-long prompts in the driver process",
    "actor_rollout_ref.rollout.layered_summon": "rlrig always hands the engine one gathered tensor at a time",
    "actor_rollout_ref.rollout.calculate_log_probs": "rlrig's vLLM and SGLang engines always return them "
    "(training/rollout_probs_diff_*); hf computes none",
    "actor_rollout_ref.model.use_shm": "rlrig loads the model from its path as it is",
    "actor_rollout_ref.model.use_fused_kernels": "rlrig computes logits only at the response positions and log-probs "
    "by logsumexp, with no separate kernel",
    "trainer.use_legacy_worker_impl": "rlrig has one worker implementation",
    "actor_rollout_ref.model.fused_kernel_options": "see use_fused_kernels",
    "reward_model.strategy": "each of rlrig's reward-model workers holds the whole model (forward passes only, no "
    "gradients or optimizer state to shard)",
    "reward_model.model.use_remove_padding": "rlrig's reward model pads each micro batch to its longest sequence; the "
    "scores are the same",
    "reward_model.model.use_shm": "rlrig loads the model from its path as it is",
    "reward_model.model.use_fused_kernels": "the reward model computes no log-probs",
    "reward_model.num_workers": "verl's reward-loop workers render and send requests to reward servers; rlrig "
    "renders in the workers that score, with no servers between",
}

# Where rlrig's default is not verl's, and why.
DEFAULTS_DIFFER = {
    "reward_model.use_reward_loop": "verl's default is True; rlrig's False scores with transformers, as verl's "
    "legacy RewardModelWorker (True: a vLLM engine in pooling mode, as verl)",
    "reward_model.rollout.tensor_model_parallel_size": "verl's default is 2; rlrig's is 1, a reward engine per GPU",
    "reward_model.rollout.dtype": "verl's default is bfloat16; rlrig's auto is bfloat16 on GPU, float32 on CPU",
    "reward_model.rollout.name": "verl has no default (it must be given); rlrig's is vllm, its only engine here",
    "reward_model.model.path": "verl's default is ~/models/FsfairX-LLaMA3-RM-v0.1; rlrig's empty default is its "
    "embedded tiny reward model",
    "actor_rollout_ref.actor.strategy": "verl's default is fsdp; rlrig's is ddp, faster for models that fit on one "
    "device (fsdp and fsdp2 both select FSDP2)",
}

# rlrig's own keys, with no verl counterpart.
RLRIG_ONLY = (
    "actor_rollout_ref.model.gguf_file",
    "critic.model.gguf_file",
    "actor_rollout_ref.rollout.cpu_kvcache_space_gb",
    "trainer.device",
    "trainer.seed",
    "trainer.wandb_proxy",
    "trainer.placement_timeout_s",
    "actor_rollout_ref.placement.resource",
    "critic.placement.resource",
    "reward_model.placement.resource",
    "actor_rollout_ref.ref.placement.resource",
    "actor_rollout_ref.ref.enable_resource_pool",
    "actor_rollout_ref.ref.nnodes",
    "actor_rollout_ref.ref.n_gpus_per_node",
    "critic.enable_resource_pool",
    "critic.nnodes",
    "critic.n_gpus_per_node",
)


def inert(key: str) -> bool:
    return any(key.startswith(p) for p in INERT_PREFIXES) and key not in REFUSED


def refusal(key: str, value: str) -> str | None:
    """Why `key=value` is refused, or None."""
    if value.strip() in ACCEPTED_DEFAULTS.get(key, ()):
        return None
    why = REFUSED.get(key) or next((w for p, w in REFUSED_PREFIXES.items() if key.startswith(p)), None)
    return f"{key}: a verl key rlrig does not implement: {why}" if why else None
