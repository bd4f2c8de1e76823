"""The keys verl 0.9 added to its PPO trainer config (verl 0.9.1's generated ppo_trainer.yaml) and the places it
moved keys to: data that trainer/config/verl_keys.py merges into its tables, under the same rule (a key rlrig takes
does what verl does with it; one it does not implement is taken only at verl's default, which turns it off, and
refused at any other value in one line saying so).

ALIASES: verl 0.9's new places of keys rlrig has (reward.*, critic.fsdp.*), each taken as the
key rlrig stores. LEGACY_UNSET: the old reward keys verl 0.9 still declares at null, "not given" (its
migrate_legacy_reward_impl copies only the ones that are not null), and reward.reward_model.model_path at
null. FILLED: keys whose verl default is an
interpolation of another key rlrig has; verl's own `${...}` text is taken (the key then is its source's value).
"""

from __future__ import annotations


def _each(prefixes: tuple[str, ...], defaults: dict) -> dict:
    return {f"{p}{k}": v for p in prefixes for k, v in defaults.items()}


_ROLES = ("actor_rollout_ref.actor.", "actor_rollout_ref.ref.", "critic.")
_FSDP = ("actor_rollout_ref.actor.fsdp_config.", "actor_rollout_ref.ref.fsdp_config.", "critic.model.fsdp_config.")
_RM_ROLLOUT = "reward_model.rollout."

_CRITIC_FSDP = (
    "_target_ wrap_policy.min_num_params param_offload optimizer_offload offload_policy reshard_after_forward "
    "fsdp_size forward_prefetch model_dtype use_orig_params seed full_determinism ulysses_sequence_parallel_size "
    "entropy_from_logits_with_chunking entropy_from_logits_chunk_size use_torch_compile entropy_checkpointing "
    "use_no_sync_for_gradient_accumulation pad_to_length pad_to_length_bucket forward_only strategy dtype "
    "mixed_precision.param_dtype mixed_precision.reduce_dtype mixed_precision.buffer_dtype"
).split()
_RM_ROLLOUT_09 = (
    "_target_ name dtype gpu_memory_utilization enforce_eager cudagraph_capture_sizes free_cache_engine "
    "data_parallel_size expert_parallel_size tensor_model_parallel_size pipeline_model_parallel_size "
    "max_num_batched_tokens max_model_len max_num_seqs load_format layered_summon scheduling_policy full_determinism "
    "seed multi_stage_wake_up engine_kwargs limit_images enable_chunked_prefill enable_prefix_caching "
    "disable_log_stats skip_tokenizer_init ignore_eos temperature top_k top_p do_sample n prompt_length "
    "response_length quantization quantization_config_file mtp"
).split()


# verl/trainer/config/legacy_reward_impl.yaml: null there means "not given"
_LEGACY_RM_ROLLOUT = (
    "name dtype gpu_memory_utilization enforce_eager cudagraph_capture_sizes free_cache_engine data_parallel_size "
    "expert_parallel_size tensor_model_parallel_size max_num_batched_tokens max_model_len max_num_seqs load_format "
    "engine_kwargs limit_images enable_chunked_prefill enable_prefix_caching disable_log_stats skip_tokenizer_init "
    "prompt_length response_length"
).split()
LEGACY_UNSET = frozenset(
    [
        *(
            f"reward_model.{k}"
            for k in (
                "num_workers",
                "reward_manager",
                "enable",
                "enable_resource_pool",
                "n_gpus_per_node",
                "nnodes",
                "reward_loop_source",
                "reward_loop_module_path",
                "reward_loop_class_name",
                "model.path",
                "model.external_lib",
                "model.trust_remote_code",
            )
        ),
        *(f"{_RM_ROLLOUT}{k}" for k in _LEGACY_RM_ROLLOUT),
        "reward.reward_model.model_path",  # verl 0.9's null: no model given, as rlrig's empty default
        "custom_reward_function.path",
        "custom_reward_function.name",
        "sandbox_fusion.url",
        "sandbox_fusion.max_concurrent",
        "sandbox_fusion.memory_limit_mb",
    ]
)

_GLOBAL_PROFILER = "global_profiler."
_PRECISION = "tool_config.precision_debugger."
FILLED = {
    **{f"{p}rollout_n": "${oc.select:actor_rollout_ref.rollout.n,1}" for p in _ROLES},
    "actor_rollout_ref.actor.use_remove_padding": "${oc.select:actor_rollout_ref.model.use_remove_padding,false}",
    "actor_rollout_ref.rollout.n_gpus_per_node": "${oc.select:trainer.n_gpus_per_node,8}",
    "actor_rollout_ref.rollout.prompt_length": "${oc.select:data.max_prompt_length,512}",
    "actor_rollout_ref.rollout.response_length": "${oc.select:data.max_response_length,512}",
    "actor_rollout_ref.rollout.trace.project_name": "${oc.select:trainer.project_name,null}",
    "actor_rollout_ref.rollout.trace.experiment_name": "${oc.select:trainer.experiment_name,null}",
    "actor_rollout_ref.rollout.mtp": "${oc.select:actor_rollout_ref.model.mtp, null}",
    "actor_rollout_ref.rollout.qat": "${oc.select:actor_rollout_ref.actor.fsdp_config.qat,"
    "${oc.select:actor_rollout_ref.actor.megatron.qat,null}}",
    "actor_rollout_ref.ref.pad_to_length": "${oc.select:actor_rollout_ref.actor.pad_to_length,False}",
    "actor_rollout_ref.ref.fsdp_config.pad_to_length_bucket": "${oc.select:actor_rollout_ref.actor.fsdp_config."
    "pad_to_length_bucket,1024}",
    "critic.loss_scale_factor": "${oc.select:actor_rollout_ref.actor.loss_scale_factor,null}",
    "data.function_tool_path": "${oc.select:actor_rollout_ref.rollout.multi_turn.function_tool_path, null}",
    **{
        f"{p}fsdp_config.{k}": f"${{oc.select:{p}{k},{d}}}"
        for p, d in (("actor_rollout_ref.actor.", "2048"), ("actor_rollout_ref.ref.", "2048"))
        for k in ("entropy_from_logits_chunk_size",)
    },
    **{
        f"{p}fsdp_config.pad_to_length": f"${{oc.select:{p}pad_to_length,False}}"
        for p in ("actor_rollout_ref.actor.", "actor_rollout_ref.ref.")
    },
    # each role's profiler takes global_profiler's, and the rollout's the actor's
    **{
        f"{p}profiler.{k}": f"${{oc.select:{_GLOBAL_PROFILER}{k},{d}}}"
        for p in _ROLES
        for k, d in (
            ("relocate_results", "false"),
            ("finish_hook_cmd", "null"),
            ("finish_hook_all_ranks", "false"),
            ("finish_hook_ranks", "[]"),
        )
    },
    **{
        f"{p}profiler.tool_config.{k}": f"${{oc.select:{_GLOBAL_PROFILER}global_tool_config.{k},{d}}}"
        for p in _ROLES
        for k, d in (
            ("torch_memory.memory_snapshot_num_steps", "1"),
            ("precision_debugger.config_path", "null"),
            ("precision_debugger.stages", "null"),
            ("precision_debugger.strict", "False"),
        )
    },
    # the rollout's own profiler follows the actor's, its tool and save_path global_profiler's
    "actor_rollout_ref.rollout.profiler.tool": f"${{oc.select:{_GLOBAL_PROFILER}tool,null}}",
    "actor_rollout_ref.rollout.profiler.save_path": f"${{oc.select:{_GLOBAL_PROFILER}save_path,null}}",
    **{
        f"actor_rollout_ref.rollout.profiler.{k}": f"${{oc.select:actor_rollout_ref.actor.profiler.{k},{d}}}"
        for k, d in (
            ("enable", "false"),
            ("all_ranks", "false"),
            ("ranks", "[]"),
            ("relocate_results", "false"),
            ("finish_hook_cmd", "null"),
            ("finish_hook_all_ranks", "false"),
            ("finish_hook_ranks", "[]"),
            ("tool_config.npu.contents", "[]"),
            ("tool_config.npu.level", "level0"),
            ("tool_config.npu.analysis", "false"),
            ("tool_config.npu.discrete", "false"),
            ("tool_config.torch.contents", "[]"),
            ("tool_config.torch.discrete", "false"),
        )
    },
    **{
        f"actor_rollout_ref.rollout.profiler.{_PRECISION}{k}": f"${{oc.select:actor_rollout_ref.actor.profiler."
        f"{_PRECISION}{k},${{oc.select:{_GLOBAL_PROFILER}global_tool_config.precision_debugger.{k},{d}}}}}"
        for k, d in (("config_path", "null"), ("stages", "null"), ("strict", "False"))
    },
    "distillation.teacher_models.teacher_model.inference.temperature": "${oc.select:actor_rollout_ref.rollout."
    "temperature}",
}

_QAT = {
    "enable": "False",
    "mode": "w4a16",
    "group_size": "16",
    "ignore_patterns": "['lm_head', 'embed_tokens', 're:.*mlp.gate$']",
    "activation_observer": "static_minmax",
    "quantization_config_path": "null",
}
_TURBO = _each(
    ("turbo_config.distributed.",),
    {
        "fully_shard_parallel_size": "16",
        "tensor_parallel_size": "1",
        "expert_parallel_size": "1",
        "expert_fully_shard_parallel_size": "1",
        "ulysses_parallel_size": "1",
        "fsdp_plan.param_dtype": "bf16",
        "fsdp_plan.reduce_dtype": "fp32",
        "fsdp_plan.output_dtype": "bf16",
        "fsdp_plan.fsdp_implementation": "native",
        "fsdp_plan.num_to_forward_prefetch": "1",
        "fsdp_plan.num_to_backward_prefetch": "1",
    },
)
_MTP_SPEC = {
    "enable": "False",
    "enable_train": "False",
    "enable_rollout": "False",
    "detach_encoder": "False",
    "mtp_loss_scaling_factor": "0.1",
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": "3",
    "speculative_eagle_topk": "1",
    "speculative_num_draft_tokens": "4",
    "method": "mtp",
    "num_speculative_tokens": "1",
}
# verl's Megatron LoRA block (model.lora.*), which its FSDP engine reads only for `merge`
_MEGATRON_LORA = {
    "type": "lora",
    "rank": "0",
    "alpha": "32",
    "dropout": "0.0",
    "target_modules": "['linear_qkv', 'linear_proj', 'linear_fc1', 'linear_fc2']",
    "exclude_modules": "[]",
    "dropout_position": "pre",
    "lora_A_init_method": "xavier",
    "lora_B_init_method": "zero",
    "a2a_experimental": "False",
    "dtype": "null",
    "adapter_path": "null",
    "freeze_vision_model": "True",
    "freeze_vision_projection": "True",
    "freeze_language_model": "True",
}
_DISAGGREGATION = {
    "enabled": "False",
    "prefill_replicas": "1",
    "decode_replicas": "1",
    "decode_tensor_model_parallel_size": "null",
    "transfer_backend": "nixl",
    "bootstrap_port": "null",
    "ib_device": "null",
}
_SKIPPED = {"enable": "False", "dump_dir": "~/.verl/rollout_dump", "steps": "[]", "action": "cache"}
ALIASES = {
    # verl 0.9's critic keeps its FSDP engine config in critic.fsdp (critic.model.fsdp_config is gone from it)
    **{f"critic.fsdp.{k}": f"critic.model.fsdp_config.{k}" for k in _CRITIC_FSDP},
    **{f"critic.fsdp.{k}": f"critic.model.fsdp_config.{k}" for k in (*_TURBO, "qat._target_")},
    **{f"critic.fsdp.qat.{k}": f"critic.model.fsdp_config.qat.{k}" for k in _QAT},
    **{f"reward.reward_model.rollout.{k}": f"{_RM_ROLLOUT}{k}" for k in _RM_ROLLOUT_09},
    **{f"reward.reward_model.rollout.disaggregation.{k}": f"{_RM_ROLLOUT}disaggregation.{k}" for k in _DISAGGREGATION},
    "reward.custom_reward_function.path": "custom_reward_function.path",
    "reward.custom_reward_function.name": "custom_reward_function.name",
    "reward.custom_reward_function.reward_kwargs": "custom_reward_function.reward_kwargs",
    **{f"reward.reward_manager.module.{k}": f"reward_manager.module.{k}" for k in ("_target_", "name")},
    "reward.reward_manager.module.path": "reward_model.reward_loop_module_path",
    "reward.num_workers": "reward_model.num_workers",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_manager.source": "reward_model.reward_loop_source",
    "reward.reward_manager._target_": "reward_manager._target_",
    "reward.reward_model.enable": "reward_model.enable",
    "reward.reward_model.enable_resource_pool": "reward_model.enable_resource_pool",
    "reward.reward_model.n_gpus_per_node": "reward_model.n_gpus_per_node",
    "reward.reward_model.nnodes": "reward_model.nnodes",
    "reward.reward_model.model_path": "reward_model.model.path",
    # verl 0.9's DAPO reward manager reads reward.reward_kwargs, which its legacy reward_model.reward_kwargs moves to
    **{
        f"reward.reward_kwargs{k}": f"reward_model.reward_kwargs{k}"
        for k in (
            "",
            ".max_resp_len",
            ".overlong_buffer_cfg",
            *(f".overlong_buffer_cfg.{x}" for x in ("enable", "len", "penalty_factor", "log")),
        )
    },
}

_HYBRID = _each(
    ("trainer.v1.separate_async.hybrid_rollout.",),
    {
        "enable_switch": "False",
        "switch_threshold_ratio": "0.4",
        "adaptive_switch_threshold": "True",
        "switch_threshold_step_up": "0.05",
        "switch_threshold_step_down": "0.03",
        "switch_threshold_release_steps": "2",
        "switch_cost_window_size": "3",
    },
)

# {reason: {key: verl 0.9's default}}, as verl_keys._AT_DEFAULT_ONLY
AT_DEFAULT_ONLY: list[tuple[str, dict[str, str]]] = [
    (
        "rlrig's FSDP reduces the gradients after every micro batch (verl's default, "
        "use_no_sync_for_gradient_accumulation=False); padding packed micro batches to a bucket length "
        "(pad_to_length) is not in rlrig",
        {
            **_each(_FSDP, {"use_no_sync_for_gradient_accumulation": "False", "pad_to_length": "False"}),
            **_each(_FSDP, {"pad_to_length_bucket": "1024"}),
            "actor_rollout_ref.actor.pad_to_length": "False",
            "actor_rollout_ref.ref.pad_to_length": "False",
        },
    ),
    ("verl's Turbo FSDP engine is not in rlrig", _each(_FSDP, _TURBO)),
    (
        "quantization-aware training is not in rlrig",
        {
            **_each((*_FSDP, "actor_rollout_ref.actor."), {f"qat.{k}": v for k, v in _QAT.items()}),
            "actor_rollout_ref.rollout.qat": "null",
        },
    ),
    (
        "rlrig leaves Nsight Systems reports in Ray's session logs (verl's relocate_results=False) and runs no "
        "command after profiling (finish_hook_cmd)",
        {
            **_each(
                (*(f"{p}profiler." for p in _ROLES), _GLOBAL_PROFILER, "actor_rollout_ref.rollout.profiler."),
                {
                    "relocate_results": "False",
                    "finish_hook_cmd": "null",
                    "finish_hook_all_ranks": "False",
                    "finish_hook_ranks": "[]",
                },
            ),
        },
    ),
    (
        "rlrig's torch_memory profiler writes a snapshot after each profiled step (verl's default)",
        _each(
            (*(f"{p}profiler.tool_config." for p in _ROLES), f"{_GLOBAL_PROFILER}global_tool_config."),
            {"torch_memory.memory_snapshot_num_steps": "1"},
        ),
    ),
    (
        "Ascend's precision debugger (msprobe) is not in rlrig",
        _each(
            (
                *(f"{p}profiler.{_PRECISION}" for p in (*_ROLES, "actor_rollout_ref.rollout.")),
                f"{_GLOBAL_PROFILER}global_tool_config.precision_debugger.",
            ),
            {"config_path": "null", "steps": "null", "stages": "null", "strict": "False"},
        ),
    ),
    (
        "Ascend NPU profiling is not in rlrig; the rollout engines record with torch (tool_config.torch.*)",
        _each(
            ("actor_rollout_ref.rollout.profiler.tool_config.npu.",),
            {"profile_token_start": "null", "profile_token_end": "null"},
        ),
    ),
    (
        "rlrig's engines take requests in their own worker, with no router between",
        {"actor_rollout_ref.rollout.router_config_path": "null"},
    ),
    (
        "tools from a Python file of functions are not in rlrig; tools are rollout.multi_turn.tool_config_path",
        {"actor_rollout_ref.rollout.multi_turn.function_tool_path": "null", "data.function_tool_path": "null"},
    ),
    (
        "rlrig hands weights to its engines in the training workers' process (verl's naive backend)",
        {"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module": "null"},
    ),
    (
        "prefill/decode disaggregation is not in rlrig",
        _each(("actor_rollout_ref.rollout.disaggregation.", f"{_RM_ROLLOUT}disaggregation."), _DISAGGREGATION),
    ),
    (
        "vision-language and audio models are not in rlrig",
        {"data.audio_key": "audios", "data.mm_processor_kwargs": "{}"},
    ),
    ("rlrig scales the loss by loss_agg_mode only", {"critic.loss_scale_factor": "null"}),
    (
        "rlrig reads the critic's config from critic.model.path and renders prompts with the actor's tokenizer",
        {"critic.model.hf_config_path": "null", "critic.model.custom_chat_template": "null"},
    ),
    (
        "fused kernels for the critic are not in rlrig (the actor's are actor_rollout_ref.model.use_fused_kernels)",
        {"critic.model.use_fused_kernels": "False", "critic.model.fused_kernel_options.impl_backend": "torch"},
    ),
    (
        "LoRA on the critic is not in rlrig (the actor's LoRA is actor_rollout_ref.model.lora_rank)",
        {"critic.model.exclude_modules": "null"},
    ),
    (
        "multi-token prediction and speculative decoding are not in rlrig",
        _each(("critic.model.mtp.", "actor_rollout_ref.model.mtp."), _MTP_SPEC),
    ),
    (
        "verl's Megatron LoRA block; its FSDP engine reads only lora.merge from it. rlrig's LoRA is "
        "actor_rollout_ref.model.lora_rank, lora_alpha, target_modules (the critic has none)",
        _each(("actor_rollout_ref.model.lora.", "critic.model.lora."), _MEGATRON_LORA),
    ),
    (
        "a generative judge's requests carry their own sampling (verl's reward servers ignore these too)",
        _each(
            (_RM_ROLLOUT,),
            {
                "temperature": "1.0",
                "top_k": "-1",
                "top_p": "1",
                "do_sample": "True",
                "n": "1",
                "ignore_eos": "False",
            },
        ),
    ),
    (
        "not in rlrig's judge or reward engines: pipeline parallel engines, layered weight loading, a scheduling "
        "policy other than first come first served, an engine seed of verl's (a judge request carries its own "
        "seed), waking in stages, quantization and multi-token prediction",
        _each(
            (_RM_ROLLOUT,),
            {
                "pipeline_model_parallel_size": "1",
                "layered_summon": "False",
                "scheduling_policy": "fcfs",
                "seed": "42",
                "multi_stage_wake_up": "False",
                "quantization": "null",
                "quantization_config_file": "null",
                "mtp": "null",
            },
        ),
    ),
    (
        "verl's transfer queue is not in rlrig",
        _each(
            ("transfer_queue.",),
            {
                "metrics.enabled": "False",
                "metrics.port": "0",
                "backend.storage_backend": "SimpleStorage",
                "backend.SimpleStorage.total_storage_size": "100000",
                "backend.SimpleStorage.num_data_storage_units": "8",
                "backend.MooncakeStore.auto_init": "False",
                "backend.MooncakeStore.metadata_server": "localhost:50123",
                "backend.MooncakeStore.master_server_address": "localhost:50124",
                "backend.MooncakeStore.local_hostname": "localhost",
                "backend.MooncakeStore.protocol": "tcp",
                "backend.MooncakeStore.global_segment_size": "4294967296",
                "backend.MooncakeStore.local_buffer_size": "1073741824",
                "backend.MooncakeStore.device_name": "",
            },
        ),
    ),
    (
        "rlrig's trainer steps as verl's default v1 sync trainer does (generate, then train on those samples); "
        "rlrig's other modes are trainer.async_mode=one_step_off_policy or fully_async_policy with a rollout pool",
        {
            "trainer.use_v1": "True",
            "trainer.v1.trainer_mode": "sync",
            "trainer.v1.sync": "{}",
            "trainer.v1.colocate_async.num_warmup_batches": "1",
            "trainer.v1.separate_async.num_warmup_batches": "1",
            "trainer.v1.separate_async.parameter_sync_step": "4",
            **_HYBRID,
        },
    ),
    (
        "verl's v1 sampler is not in rlrig; data.sampler.class_path is a sampler of your own",
        _each(
            ("trainer.v1.sampler.",),
            {
                "max_off_policy_threshold": "8",
                "max_off_policy_strategy": "drop",
                "sync_refill_failed_groups": "False",
                "custom_sampler.path": "null",
                "custom_sampler.name": "null",
                "sampler_kwargs": "{}",
            },
        ),
    ),
    ("a checkpoint callback class of your own is not in rlrig", {"trainer.checkpoint_callback_class": "null"}),
    (
        "rlrig's agent loop tokenizes as verl 0.9.0's default (continuous_token.enable=False) does: the model's "
        "tokens are kept and each added message is rendered alone by the chat template; verl's Continuous Token "
        "builder (model_family) is not in rlrig",
        _each(("data.continuous_token.",), {"enable": "False", "model_family": "auto"}),
    ),
    (
        "replaying dumped rollouts is not in rlrig",
        _each(("skip.rollout.", "skip.rollout_tq.", "skip.async_rollout."), _SKIPPED),
    ),
]

# On-policy distillation (config/schema.DistillationConfig): the teacher's engine settings, taken at verl's defaults.
_TEACHER = "distillation.teacher_models.teacher_model."
DISTILLATION = (
    "rlrig's teacher engine (hf or vLLM, inference.name) runs one replica per tensor_model_parallel_size devices "
    "(hf: per device) on token ids, without CUDA graphs captured by size, statistics logs or images",
    {
        f"{_TEACHER}num_replicas": "0",
        **_each(
            (f"{_TEACHER}inference.",),
            {
                "cudagraph_capture_sizes": "null",
                "data_parallel_size": "1",
                "expert_parallel_size": "1",
                "limit_images": "null",
                "disable_log_stats": "True",
                "skip_tokenizer_init": "True",
            },
        ),
    },
)
# Keys under these that rlrig does not have, refused with the reason (a section verl lets a user add keys to); the
# teachers verl adds as distillation.teacher_models.<name>.* are rlrig's too (config/overrides.py)
REFUSED_NEW_KEYS: dict[str, str] = {}

# Keys taken only as verl's own `${...}` (FILLED), which no group above names: why another value is refused
FILLED_ONLY = {
    **{
        f"actor_rollout_ref.rollout.trace.{k}": f"rlrig names its traces' MLflow experiment by trainer.{k}, verl's "
        "default for this key; set that"
        for k in ("project_name", "experiment_name")
    },
    f"{_TEACHER}inference.temperature": "verl's teacher computes prompt log-probs at temperature 1 whatever this "
    "is (a forward pass), and so does rlrig's",
}

# The dataclasses verl 0.9 builds its new sections into, taken at verl's own; the names are as canonical keys
TARGETS = {
    **_each(_FSDP, {"qat._target_": "verl.workers.config.QATEngineConfig"}),
    **_each(
        tuple(f"{p}profiler.tool_config." for p in _ROLES),
        {
            "torch.schedule._target_": "verl.utils.profiler.config.TorchProfilerScheduleConfig",
            "precision_debugger._target_": "verl.utils.profiler.config.PrecisionDebuggerToolConfig",
        },
    ),
    **_each(
        ("actor_rollout_ref.rollout.profiler.tool_config.", f"{_GLOBAL_PROFILER}global_tool_config."),
        {"precision_debugger._target_": "verl.utils.profiler.config.PrecisionDebuggerToolConfig"},
    ),
    "actor_rollout_ref.rollout.profiler.tool_config.npu._target_": "verl.utils.profiler.config.NPUToolConfig",
    "actor_rollout_ref.rollout.profiler.tool_config.torch._target_": "verl.utils.profiler.config."
    "TorchProfilerToolConfig",
    "critic.model.mtp._target_": "verl.workers.config.MtpConfig",
    "reward._target_": "verl.workers.config.RewardConfig",
    "reward.reward_model._target_": "verl.workers.config.RewardModelConfig",
    "trainer.v1.separate_async.hybrid_rollout._target_": "verl.trainer.config.HybridRolloutSwitchConfig",
    "skip._target_": "verl.utils.skip.SkipManagerConfig",
    "reward.sandbox_fusion._target_": "verl.workers.config.SandboxFusionConfig",
    "distillation._target_": "verl.workers.config.DistillationConfig",
    "distillation.distillation_loss._target_": "verl.workers.config.DistillationLossConfig",
    f"{_TEACHER}_target_": "verl.workers.config.DistillationTeacherModelConfig",
    f"{_TEACHER}inference._target_": "verl.workers.config.RolloutConfig",
}

# verl 0.9's defaults of keys verl_keys takes at b178a3c's: both are taken
ALSO_ACCEPTED = {
    "critic.model._target_": ("verl.workers.config.HFModelConfig",),
    "reward_manager._target_": ("verl.workers.config.reward.RewardManagerConfig",),
    "critic.model.tokenizer_path": ("null", "None"),
    "actor_rollout_ref.rollout.nnodes": ("0",),
    # the YAML text 'true', a string (verl writes it quoted for Nsight's command line)
    "global_profiler.global_tool_config.nsys.controller_nsight_options.cuda-memory-usage": ("'true'",),
}

NO_EFFECT = {
    "actor_rollout_ref.model.lora.merge": "rlrig hands its engines the LoRA adapter merged into the weights, as "
    "verl's True does; verl's False hands vLLM or SGLang the adapter to apply beside the base weights, the same "
    "policy (in exact arithmetic) through another transport",
    "critic.model.lora.merge": "verl reads it where the actor's weights reach the rollout engines; the critic's never "
    "do",
    **{
        f"{p}checkpoint.strict": "read only by verl's Megatron backend (the strict check of its Hugging Face weight "
        "export); verl's FSDP engine does not read it, nor does rlrig"
        for p in ("actor_rollout_ref.actor.", "critic.")
    },
    **{
        f"{p}entropy_from_logits_chunk_size": "rlrig computes log-probs and entropy a chunk of tokens at a time with a "
        "backward of its own (trainer/model/chunked_logprobs.py); verl's chunk size of its entropy chunking changes "
        "only the memory it takes, not the values"
        for p in (*_FSDP, "actor_rollout_ref.actor.", "actor_rollout_ref.ref.")
    },
}

# Where rlrig's default is not verl 0.9's, and why.
DEFAULTS_DIFFER = {
    "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size": "verl's default is 2; "
    "rlrig's is 1, so that its default colocated teacher (distillation.nnodes=0) runs on a single training worker; "
    "set 2 for verl's engines of two devices (the hf teacher is a whole copy per device whatever it is)",
    "data.seed": "verl's default is null (its sampler's unseeded torch.Generator); rlrig's is 1, a seed of its own",
    "actor_rollout_ref.rollout.seed": "verl's default is 42 (an engine's seed is it plus the engine's index); "
    "rlrig's null seeds the engines from trainer.seed the same way",
}
