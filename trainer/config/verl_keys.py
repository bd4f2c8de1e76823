"""verl's keys that rlrig does not take as they are: refused in one line saying so, accepted where they
change nothing for rlrig (said in `--print-config`), and rlrig's own additions.

The rule: every key rlrig accepts does what verl does with it; a verl key rlrig does not implement is
refused at start-up, never accepted and ignored.

The tables, top to bottom: ALIASES; REFUSED_PREFIXES, families refused by prefix; _AT_DEFAULT_ONLY, keys taken at
verl's default only, grouped by reason, and _TARGETS, the `_target_` dataclass names taken at verl's own, which
REFUSED and ACCEPTED_DEFAULTS draw on; REFUSED, single keys refused; ACCEPTED_DEFAULTS, the values a refused key is
accepted at; NO_EFFECT, keys accepted at any value; DEFAULTS_DIFFER and RLRIG_ONLY. `--print-config` lists the last
three. The keys verl 0.9 added or moved are in verl09_keys.py, merged into these tables below; the keys of the
releases before (0.7.0 to 0.8.0) sit in the groups above with their reason. FILLED: verl's own `${...}` defaults
taken as the keys they read.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from ..errors import ConfigError
from . import verl09_keys
from .literals import parse_literal

# verl's other spellings of keys rlrig has, each taken as the key it names
ALIASES = {
    "ray_init.num_cpus": "ray_kwargs.ray_init.num_cpus",
    "ray_init.timeline_file": "ray_kwargs.timeline_json_file",
    "trainer.nnode": "trainer.nnodes",  # the FAQ's spelling
    # verl 0.7.0's place of the bucket its SGLang rollout packs weights into, rollout.checkpoint_engine's since
    "actor_rollout_ref.rollout.update_weights_bucket_megabytes": "actor_rollout_ref.rollout.checkpoint_engine."
    "update_weights_bucket_megabytes",
    # verl's reward_manager section: a reward manager of your own (reward/own_managers.py)
    "reward_manager.source": "reward_model.reward_loop_source",
    "reward_manager.module.path": "reward_model.reward_loop_module_path",
    # verl's legacy FSDP workers (its default, use_legacy_worker_impl=auto) clip with actor.grad_clip and
    # critic.grad_clip, its engine workers with optim.clip_grad; both default to 1.0, and rlrig has one norm for each
    "actor_rollout_ref.actor.grad_clip": "actor_rollout_ref.actor.optim.clip_grad",
    "critic.grad_clip": "critic.optim.clip_grad",
    # verl 0.9's places of sandbox fusion (reward.sandbox_fusion, and its legacy top-level sandbox_fusion)
    **{
        f"{section}sandbox_fusion.{k}": f"reward_model.sandbox_fusion.{k}"
        for section in ("reward.", "")
        for k in ("url", "max_concurrent", "memory_limit_mb")
    },
}


def _each(prefixes: tuple[str, ...], defaults: dict) -> dict:
    return {f"{p}{k}": v for p in prefixes for k, v in defaults.items()}


_TRAINED = ("actor_rollout_ref.actor.", "critic.")
_FSDP = ("actor_rollout_ref.actor.fsdp_config.", "actor_rollout_ref.ref.fsdp_config.", "critic.model.fsdp_config.")
_PROFILED = ("actor_rollout_ref.actor.", "actor_rollout_ref.ref.", "critic.")  # the roles with a profiler.tool_config

_RM_TOOL_CONFIG = (
    "the reward model's profiler takes the actor's tool_config (verl's default); set "
    "actor_rollout_ref.actor.profiler.tool_config"
)
# Whole families of verl keys, by prefix: what they are and what rlrig offers instead.
REFUSED_PREFIXES = {
    # verl's profilers are (global_profiler.*, each role's profiler.*) but for these parts; their defaults are accepted
    "global_profiler.global_tool_config.nsys.controller_nsight_options.": "rlrig's driver is the process you launch, "
    "not a Ray actor whose runtime_env Nsight Systems could wrap; run it under `nsys profile` yourself "
    "(global_tool_config.nsys.worker_nsight_options wrap the workers)",
    **{
        f"{p}.profiler.tool_config.npu.": "Ascend NPU profiling is not in rlrig; global_profiler.tool is nsys, torch "
        "or torch_memory"
        for p in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "actor_rollout_ref.rollout")
    },
    "reward_model.profiler.tool_config.": _RM_TOOL_CONFIG,
    "actor_rollout_ref.actor.megatron.": "verl's Megatron backend is not in rlrig; actor_rollout_ref.actor.strategy is "
    "ddp or fsdp",
    "actor_rollout_ref.ref.megatron.": "verl's Megatron backend is not in rlrig; the reference is sharded as the actor",
    "critic.megatron.": "verl's Megatron backend is not in rlrig; the critic is sharded as the actor",
    "actor_rollout_ref.model.lora.": "verl's Megatron LoRA config is not in rlrig; rlrig's LoRA is "
    "actor_rollout_ref.model.lora_rank, lora_alpha, target_modules",
    "actor_rollout_ref.teacher.": "verl's on-policy distillation (the GKD recipe's teacher server) is not in rlrig",
    "reward_model.overlong_buffer.": "the dapo recipe's older place for the overlong penalty; rlrig's is "
    "reward_model.reward_manager=dapo with reward_model.reward_kwargs.overlong_buffer_cfg.*",
    "trainer.spo.": "the spo recipe's offline values are not in rlrig",
}

# verl keys rlrig takes only at verl's default, which asks for what rlrig does anyway; any other value is refused
# with the reason, which names what rlrig offers. Grouped by reason: {key: verl's default}.
_AT_DEFAULT_ONLY: list[tuple[str, dict[str, str]]] = [
    (
        "rlrig's optimizer is torch.optim.AdamW with torch's betas (0.9, 0.999); optim.lr, weight_decay, clip_grad "
        "and the scheduler keys are what it takes",
        _each(
            tuple(f"{p}optim." for p in _TRAINED),
            {
                "optimizer": "AdamW",
                "optimizer_impl": "torch.optim",
                "betas": "[0.9, 0.999]",
                "override_optimizer_config": "null",
            },
        ),
    ),
    (
        "verl fills it from the trainer's step count; set trainer.total_training_steps",
        _each(tuple(f"{p}optim." for p in _TRAINED), {"total_training_steps": "-1"}),
    ),
    (
        "rlrig's FSDP2 shards every transformer block and the root (over fsdp_config.fsdp_size workers), with no "
        "prefetch; fsdp_config.offload_policy, param_offload and optimizer_offload are what it takes",
        _each(_FSDP, {"wrap_policy.min_num_params": "0", "forward_prefetch": "False"}),
    ),
    (
        "verl's new-engine copy of the section's strategy; rlrig's is actor_rollout_ref.actor.strategy",
        _each(_FSDP, {"strategy": "fsdp"}),
    ),
    (
        "verl's new-engine compute dtype; rlrig computes in fsdp_config.mixed_precision.param_dtype (bf16 on GPU)",
        _each(_FSDP, {"dtype": "bfloat16"}),
    ),
    (
        "verl's new-engine seed; rlrig seeds each worker from trainer.seed (fsdp_config.full_determinism included)",
        _each(_FSDP, {"seed": "42"}),
    ),
    (
        "set by verl itself (True for the reference, which only runs forward passes)",
        {
            "actor_rollout_ref.actor.fsdp_config.forward_only": "False",
            "critic.model.fsdp_config.forward_only": "False",
            "actor_rollout_ref.ref.fsdp_config.forward_only": "True",
        },
    ),
    (
        "rlrig takes each mini batch in order (verl's default, shuffle=False: no seed is drawn)",
        _each(_TRAINED, {"shuffle": "False", "data_loader_seed": "42"}),
    ),
    (
        "rlrig's value loss is a token mean (verl's default); other aggregations for the critic are not in rlrig",
        {"critic.loss_agg_mode": "token-mean"},
    ),
    (
        "rlrig uses a critic exactly when algorithm.adv_estimator needs one (verl's enable=null)",
        {"critic.enable": "null"},
    ),
    (
        "rlrig scales the loss by loss_agg_mode only",
        {"actor_rollout_ref.actor.loss_scale_factor": "null"},
    ),
    (
        "vision-language models are not in rlrig",
        {
            "actor_rollout_ref.actor.freeze_vision_tower": "False",
            "data.image_patch_size": "14",
            "data.image_key": "images",
            "data.video_key": "videos",
            "data.return_multi_modal_inputs": "True",
            "reward_model.rollout.limit_images": "null",
        },
    ),
    (
        "checkpoints are written synchronously in rlrig",
        {"actor_rollout_ref.actor.checkpoint.async_save": "False", "critic.checkpoint.async_save": "False"},
    ),
    (
        "verl's Megatron backend is not in rlrig; mbridge_config (verl 0.7.1, 0.8) passes options to its Megatron "
        "checkpoint's Hugging Face export",
        _each(tuple(f"{p}checkpoint." for p in _TRAINED), {"mbridge_config": "{}"}),
    ),
    (
        "rlrig's MoE routing replay keeps the routing in the step's batch (actor.router_replay.mode R2 or R3), never "
        "in files, and the reference routes as its own router does",
        {
            **_each(
                ("actor_rollout_ref.actor.router_replay.", "actor_rollout_ref.ref.router_replay."),
                {"record_file": "null", "replay_file": "null"},
            ),
            "actor_rollout_ref.ref.router_replay.mode": "disabled",
        },
    ),
    ("rlrig's engines stop at EOS", {"actor_rollout_ref.rollout.ignore_eos": "False"}),
    (
        "rlrig's engines use their own CUDA-graph sizes (rollout.enforce_eager turns graphs off)",
        {
            "actor_rollout_ref.rollout.cudagraph_capture_sizes": "null",
            "reward_model.rollout.cudagraph_capture_sizes": "null",
        },
    ),
    (
        "an engine spans rollout.tensor_model_parallel_size GPUs and no more; data and pipeline parallel engines are "
        "not in rlrig (actor_rollout_ref.rollout.expert_parallel_size splits an MoE's experts over those GPUs)",
        {
            "actor_rollout_ref.rollout.data_parallel_size": "1",
            "actor_rollout_ref.rollout.pipeline_model_parallel_size": "1",
            "reward_model.rollout.data_parallel_size": "1",
            "reward_model.rollout.expert_parallel_size": "1",
        },
    ),
    (
        "rlrig's engines schedule first come, first served (vLLM's default)",
        {"actor_rollout_ref.rollout.scheduling_policy": "fcfs"},
    ),
    (
        "rlrig hands weights to its engines in the training workers' process (verl's naive backend)",
        {
            "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive",
            "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs": "{}",
        },
    ),
    (
        "replaying dumped rollouts is not in rlrig",
        {
            "actor_rollout_ref.rollout.skip_rollout": "False",
            # verl 0.8's rollout.skip section
            **_each(
                ("actor_rollout_ref.rollout.skip.",),
                {"enable": "False", "dump_dir": "~/.verl/rollout_dump", "max_dump_step": "1", "action": "cache"},
            ),
        },
    ),
    (
        "rlrig's engines take and return token ids; the rollout engine's tokenizer is not loaded (verl's default)",
        {"actor_rollout_ref.rollout.skip_tokenizer_init": "True"},
    ),
    (
        "the reward engine renders text with its tokenizer (verl's default)",
        {"reward_model.rollout.skip_tokenizer_init": "False"},
    ),
    (
        "verl 0.7's window of torch profiler steps inside one update (tool_config.torch.step_start, step_end) is not "
        "in rlrig; its torch profiler records whole training steps (global_profiler.steps)",
        _each(tuple(f"{p}profiler.tool_config.torch." for p in _PROFILED), {"step_start": "0", "step_end": "null"}),
    ),
    ("rlrig's engines export no Prometheus metrics", {"actor_rollout_ref.rollout.prometheus.enable": "False"}),
    (
        "quantized rollout is not in rlrig",
        {
            "actor_rollout_ref.rollout.quantization": "null",
            "actor_rollout_ref.rollout.quantization_config_file": "null",
        },
    ),
    (
        "multi-token prediction and speculative decoding are not in rlrig",
        {
            "actor_rollout_ref.rollout.mtp": "null",
            "actor_rollout_ref.model.mtp.enable": "False",
            **_each(
                ("actor_rollout_ref.model.mtp.",),
                {
                    "enable_train": "False",
                    "enable_rollout": "False",
                    "detach_encoder": "False",
                    "mtp_loss_scaling_factor": "0.1",
                    "speculative_algorithm": "EAGLE",
                    "speculative_num_steps": "2",
                    "speculative_eagle_topk": "2",
                    "speculative_num_draft_tokens": "4",
                    "method": "mtp",
                    "num_speculative_tokens": "1",
                },
            ),
        },
    ),
    (
        "rlrig reads the model's config and tokenizer from actor_rollout_ref.model.path",
        {
            "actor_rollout_ref.model.hf_config_path": "null",
            "actor_rollout_ref.model.tokenizer_path": "null",
            "data.tokenizer": "null",
        },
    ),
    (
        "rlrig renders prompts with the tokenizer's own chat template (data.apply_chat_template_kwargs reach it)",
        {"actor_rollout_ref.model.custom_chat_template": "null"},
    ),
    (
        "tiled MLP is not in rlrig",
        {
            **_each(
                ("actor_rollout_ref.model.tiled_mlp.", "critic.model.tiled_mlp."),
                {"enabled": "False", "num_shards": "4"},
            )
        },
    ),
    (
        "rlrig reads every row of data.train_files and data.val_files",
        {"data.train_max_samples": "-1", "data.val_max_samples": "-1"},
    ),
    (
        "rlrig picks the reward function by each row's data_source (verl's default)",
        {"data.reward_fn_key": "data_source"},
    ),
    (
        "rlrig hands the reward model its own rendering of the decoded text (reward_model.model.input_tokenizer)",
        {"data.return_raw_input_ids": "False", "data.return_full_prompt": "False"},
    ),
    ("rlrig validates in file order", {"data.validation_shuffle": "False"}),
    (
        "rlrig's agent loop talks to the engine in its own worker; a server class of your own is not in rlrig",
        {
            "actor_rollout_ref.rollout.agent.custom_async_server.path": "null",
            "actor_rollout_ref.rollout.agent.custom_async_server.name": "null",
        },
    ),
    (
        "generated data sets are not in rlrig; it reads verl's parquet schema",
        {"data.datagen.path": "null", "data.datagen.name": "null"},
    ),
    (
        "rlrig keeps its validation samples in val_generations.jsonl (trainer.log_val_generations); dumping every "
        "rollout is not in rlrig",
        {"trainer.rollout_data_dir": "null", "trainer.validation_data_dir": "null"},
    ),
    ("Ascend's elastic training is not in rlrig", {"trainer.esi_redundant_time": "0"}),
    ("rlrig keeps the checkpoint it resumed from", {"trainer.del_local_ckpt_after_load": "False"}),
    (
        "rlrig keeps every checkpoint",
        {"trainer.max_actor_ckpt_to_keep": "null", "trainer.max_critic_ckpt_to_keep": "null"},
    ),
    ("verl's transfer queue is not in rlrig", {"transfer_queue.enable": "False"}),
]

# The dataclasses verl builds its sections into (`_target_`): accepted at verl's own (refusal() refuses any other).
_TARGETS = {
    **_each(tuple(f"{p}optim." for p in _TRAINED), {"_target_": "verl.workers.config.FSDPOptimizerConfig"}),
    **_each(_FSDP + ("reward_model.model.fsdp_config.",), {"_target_": "verl.workers.config.FSDPEngineConfig"}),
    "actor_rollout_ref.actor._target_": "verl.workers.config.FSDPActorConfig",
    "actor_rollout_ref.ref._target_": "verl.workers.config.FSDPActorConfig",
    "actor_rollout_ref.actor.policy_loss._target_": "verl.workers.config.PolicyLossConfig",
    "actor_rollout_ref.actor.checkpoint._target_": "verl.trainer.config.CheckpointConfig",
    "critic.checkpoint._target_": "verl.trainer.config.CheckpointConfig",
    "actor_rollout_ref.actor.router_replay._target_": "verl.workers.config.RouterReplayConfig",
    "actor_rollout_ref.ref.router_replay._target_": "verl.workers.config.RouterReplayConfig",
    "actor_rollout_ref.rollout._target_": "verl.workers.config.RolloutConfig",
    "reward_model.rollout._target_": "verl.workers.config.RolloutConfig",
    "actor_rollout_ref.rollout.val_kwargs._target_": "verl.workers.config.SamplingConfig",
    "actor_rollout_ref.rollout.multi_turn._target_": "verl.workers.config.MultiTurnConfig",
    "actor_rollout_ref.rollout.agent._target_": "verl.workers.config.AgentLoopConfig",
    "actor_rollout_ref.rollout.skip._target_": "verl.workers.config.SkipConfig",  # verl 0.8
    "actor_rollout_ref.rollout.trace._target_": "verl.workers.config.TraceConfig",
    "actor_rollout_ref.rollout.agent.custom_async_server._target_": "verl.workers.config.CustomAsyncServerConfig",
    "actor_rollout_ref.rollout.checkpoint_engine._target_": "verl.workers.config.CheckpointEngineConfig",
    "actor_rollout_ref.rollout.prometheus._target_": "verl.workers.config.PrometheusConfig",
    "actor_rollout_ref.model._target_": "verl.workers.config.HFModelConfig",
    "actor_rollout_ref.model.mtp._target_": "verl.workers.config.MtpConfig",
    "reward_manager._target_": "verl.trainer.config.config.RewardManagerConfig",
    "reward_manager.module._target_": "verl.trainer.config.config.ModuleConfig",
    "critic._target_": "verl.workers.config.FSDPCriticConfig",
    "critic.model._target_": "verl.workers.config.FSDPCriticModelCfg",
    "algorithm._target_": "verl.trainer.config.AlgoConfig",
    "algorithm.kl_ctrl._target_": "verl.trainer.config.KLControlConfig",
    "algorithm.filter_groups._target_": "verl.trainer.config.FilterGroupsConfig",
    # the profilers
    **_each(
        (*_PROFILED, "actor_rollout_ref.rollout.", "reward_model.", "global_"),
        {"profiler._target_": "verl.utils.profiler.ProfilerConfig"},
    ),
    **_each(
        tuple(f"{p}profiler.tool_config." for p in _PROFILED),
        {
            "nsys._target_": "verl.utils.profiler.config.NsightToolConfig",
            "npu._target_": "verl.utils.profiler.config.NPUToolConfig",
            "torch._target_": "verl.utils.profiler.config.TorchProfilerToolConfig",
            "torch_memory._target_": "verl.utils.profiler.config.TorchMemoryToolConfig",
        },
    ),
    "global_profiler.global_tool_config.nsys._target_": "verl.utils.profiler.config.NsightToolConfig",
}

# Single verl keys refused (a value ACCEPTED_DEFAULTS lists aside): the _AT_DEFAULT_ONLY groups, then by section what
# verl fills from another key, which rlrig takes, what a recipe built on verl's trainer adds, and what rlrig lacks.
REFUSED = {
    **{key: why for why, keys in _AT_DEFAULT_ONLY for key in keys},
    # data
    **{
        f"data.{k}": "the prime recipe's accuracy filter is not in rlrig"
        for k in ("accuracy_lower_bound", "accuracy_upper_bound", "filter_accuracy")
    },
    "data.oversample_factor": "oversampling prompts is not in rlrig; each step samples data.train_batch_size",
    # actor_rollout_ref
    **{
        f"{p}rollout_n": "verl fills it from actor_rollout_ref.rollout.n; set that"
        for p in ("actor_rollout_ref.actor.", "actor_rollout_ref.ref.", "critic.")
    },
    "actor_rollout_ref.actor.use_remove_padding": "verl fills it from actor_rollout_ref.model.use_remove_padding; "
    "set that",
    **{
        f"actor_rollout_ref.actor.{k}": f"not a key of verl's actor; rlrig and verl read "
        f"actor_rollout_ref.actor.policy_loss.{k}"
        for k in ("clip_cov_lb", "clip_cov_ratio", "clip_cov_ub", "loss_mode")
    },
    # verl 0.9's examples/sapo_trainer scripts write +policy_loss.tau_pos, which its PolicyLossConfig refuses
    **{
        f"actor_rollout_ref.actor.policy_loss.{k}": f"not a key of verl 0.9's PolicyLossConfig (verl stops there "
        f"with a TypeError); SAPO reads actor_rollout_ref.actor.{k} in verl and rlrig: set that"
        for k in ("tau_pos", "tau_neg")
    },
    "actor_rollout_ref.actor.max_token_len": "not a key of verl's actor; set "
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.actor.optim.lr_decay_style": "Megatron's optimizer key; rlrig's is "
    "actor_rollout_ref.actor.optim.lr_scheduler_type (constant|cosine)",
    "actor_rollout_ref.rollout.prompt_length": "verl fills it from data.max_prompt_length; set that",
    "actor_rollout_ref.rollout.response_length": "verl fills it from data.max_response_length; set that",
    "actor_rollout_ref.rollout.logprobs_mode": "rlrig's vLLM engine returns processed log-probs (verl's default, "
    "the distribution each token was drawn from); raw log-probs or logits are not in rlrig",
    "actor_rollout_ref.rollout.enable_spec_decoding": "speculative decoding is not in rlrig",
    # verl's SGLang server mode became its only one; its RolloutConfig no longer has the key and refuses it too
    "actor_rollout_ref.rollout.sglang_rollout_mode": "not a key of verl's RolloutConfig any more (verl refuses it "
    "as well); drop it",
    "actor_rollout_ref.rollout.nnodes": "verl's standalone rollout replicas are not in rlrig; a rollout pool of "
    "its own is actor_rollout_ref.hybrid_engine=False with the top-level rollout.nnodes",
    "actor_rollout_ref.rollout.n_gpus_per_node": "verl's standalone rollout replicas are not in rlrig; a rollout "
    "pool of its own is actor_rollout_ref.hybrid_engine=False with the top-level rollout.n_gpus_per_node",
    "actor_rollout_ref.rollout.total_rollout_steps": "verl's fully async recipe reads the top-level "
    "rollout.total_rollout_steps; set that",
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": "re-rendering each turn's context with the "
    "inference chat template (past reasoning dropped) is not in rlrig, nor in verl's agent loop, which reads it "
    "nowhere (only its retired SGLang rollout did); the engine continues from the sample's own tokens",
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": "verl declares it for the CollabLLM recipe's "
    "simulated conversations and its agent loop reads it nowhere; CollabLLM is not in rlrig",
    # critic
    "critic.model.lora_rank": "LoRA on the critic is not in rlrig; the critic trains all its weights (the actor's "
    "LoRA is actor_rollout_ref.model.lora_rank)",
    "critic.model.lora_alpha": "LoRA on the critic is not in rlrig (see critic.model.lora_rank)",
    "critic.model.target_modules": "LoRA on the critic is not in rlrig (see critic.model.lora_rank)",
    "critic.model.lora_adapter_path": "LoRA on the critic is not in rlrig (see critic.model.lora_rank)",
    "critic.model.tokenizer_path": "rlrig's critic reads the actor's tokens (verl's default for this key)",
    # algorithm
    "algorithm.rollout_correction.rollout_rs_threshold_lower": "not a key of verl's rollout correction (verl "
    "b178a3c); both bounds go in algorithm.rollout_correction.rollout_rs_threshold (lower_upper for a k1 option)",
    "algorithm.rollout_correction.rollout_token_veto_threshold": "verl's token veto is not in its rollout "
    "correction (verl b178a3c); bound each token with algorithm.rollout_correction.rollout_rs=token_k1 (or "
    "token_k2, token_k3) and rollout_rs_threshold",
    # reward_model, reward_manager
    "reward_model.profiler.tool_config": _RM_TOOL_CONFIG,
    "actor_rollout_ref.rollout.profiler.tool_config": "verl b178a3c's whole tool_config of the rollout's profiler; "
    "set its keys (actor_rollout_ref.rollout.profiler.tool_config.torch.*)",
    "reward_model.micro_batch_size": "verl's deprecated global micro batch; set reward_model.micro_batch_size_per_gpu",
    "reward_model.launch_reward_fn_async": "rlrig scores in the step, not asynchronously during the log-prob pass",
    "reward_model.ulysses_sequence_parallel_size": "sequence parallelism for the reward model is not in rlrig (the "
    "actor's, reference's and critic's are)",
    **{
        f"reward_model.{k}": "the prime recipe's implicit reward model, trained with the policy, is not in rlrig"
        for k in ("mini_batch_size", "model.beta_train", "model.optim.grad_clip", "model.optim.lr", "model.update")
    },
    "reward_manager.name": "rlrig's is reward_model.reward_manager (naive|dapo), which verl's default for this "
    "key follows; set that",
    # trainer
    **{
        f"trainer.{k}": "a key of one of verl's recipes, not of its PPO trainer"
        for k in (
            "debug",
            "dump_high_diff_dir",
            "dump_high_diff_tokens",
            "log_freq",
            "ref_update_freq",
            "rl_logging_board_dir",
            "scheduler",
        )
    },
    "trainer.tensorboard_dir": "rlrig's loggers are trainer.logger; TensorBoard is not among them",
    # rollout (the rollout pool), async_training
    # verl's fully async config declares it (4) and none of verl's code reads it: its default is accepted
    "rollout.n": "not read by verl (its fully async config declares it); the samples per prompt are "
    "actor_rollout_ref.rollout.n",
    "async_training.parallel_validate_and_rollout": "rlrig validates on the rollout pool between weight versions, "
    "not beside generation",
}

# The values rlrig accepts for a key it otherwise refuses (REFUSED, REFUSED_PREFIXES, a `_target_`): verl's
# default, which asks for nothing; each spelling verl's configs and scripts write.
ACCEPTED_DEFAULTS = {
    **{key: (default,) for _, keys in _AT_DEFAULT_ONLY for key, default in keys.items()},
    **{key: (target,) for key, target in _TARGETS.items()},
    # actor_rollout_ref
    "actor_rollout_ref.rollout.logprobs_mode": ("processed_logprobs",),
    "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template": ("False", "false"),
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": ("null", "None"),
    # reward_manager: verl 0.7.1's dataclass name for its reward.reward_manager section
    "reward_manager._target_": (
        _TARGETS["reward_manager._target_"],
        "verl.workers.config.reward_model.RewardManagerConfig",
    ),
    # critic: verl's defaults, LoRA off
    "critic.model.lora_rank": ("0",),
    "critic.model.lora_alpha": ("16",),
    "critic.model.target_modules": ("all-linear",),
    "critic.model.lora_adapter_path": ("null", "None"),
    # algorithm: verl 0.7's rollout correction keys at null, which bound nothing more (a k1 option's lower bound is
    # the reciprocal of rollout_rs_threshold, as verl 0.7's null lower bound is; no token veto)
    "algorithm.rollout_correction.rollout_rs_threshold_lower": ("null", "None"),
    "algorithm.rollout_correction.rollout_token_veto_threshold": ("null", "None"),
    # reward_model
    "reward_model.micro_batch_size": ("null", "None"),
    "reward_model.launch_reward_fn_async": ("False", "false"),
    "reward_model.ulysses_sequence_parallel_size": ("1",),
    # rollout (the rollout pool), async_training
    "rollout.n": ("4",),
    "async_training.parallel_validate_and_rollout": ("False", "false"),
    # the profilers' parts rlrig does not have (REFUSED_PREFIXES): the driver's Nsight options, NPU settings; the
    # rollout profiler's tool_config as a whole at verl b178a3c's null (its keys are rlrig's)
    "actor_rollout_ref.rollout.profiler.tool_config": ("null",),
    "reward_model.profiler.tool_config": ("null",),
    **{
        f"global_profiler.global_tool_config.nsys.controller_nsight_options.{k}": (v,)
        for k, v in {
            "trace": "cuda,nvtx,cublas,ucx",
            "cuda-memory-usage": "true",
            "cuda-graph-trace": "graph",
        }.items()
    },
    **_each(
        tuple(f"{p}profiler.tool_config.npu." for p in _PROFILED),
        {"contents": ("[]",), "level": ("level0",), "analysis": ("True",), "discrete": ("False",)},
    ),
}

# Keys accepted because, for rlrig, they change nothing at any value; accepted and not stored, and `--print-config`
# lists them with the reason.
_OWN_CLASS = (
    "verl 0.9 does not read it: its reward loop loads the class reward.reward_manager.name names "
    "(reward_model.reward_manager) from module.path"
)
NO_EFFECT = {
    # reward_manager: verl 0.9 moves reward_loop_class_name to module.name, and reads neither
    "reward_manager.module.name": _OWN_CLASS,
    "reward_model.reward_loop_class_name": _OWN_CLASS,
    # data
    "data.return_raw_chat": "rlrig applies the chat template itself on the driver; raw or templated, the engine gets "
    "the same tokens",
    "data.dataloader_num_workers": "rlrig reads the data set in the driver process",
    "data.filter_overlong_prompts_workers": "rlrig filters over-long prompts in the driver process",
    "data.use_shm": "rlrig reads the data files from their path as they are",
    # actor_rollout_ref
    "actor_rollout_ref.model.use_shm": "rlrig loads the model from its path as it is",
    **{
        f"{p}use_orig_params": "verl passes it only to FSDP1 (strategy=fsdp), where True hands the optimizer the "
        "original parameters instead of flat ones, the same elementwise AdamW update; under FSDP2 (verl's fsdp2, "
        "rlrig's fsdp and fsdp2) parameters are always the originals"
        for p in _FSDP
    },
    **{
        f"{p}{k}": "rlrig computes log-probs and entropy a chunk of tokens at a time with a backward of its own, "
        "keeping no fp32 copy of the logits and no softmax (trainer/model/chunked_logprobs.py): the memory verl's "
        "entropy checkpointing and chunking save, with the same values"
        for p in (*_FSDP, "actor_rollout_ref.actor.", "actor_rollout_ref.ref.")
        for k in ("entropy_from_logits_with_chunking", "entropy_checkpointing")
    },
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing": "verl recomputes sum_pi_squared in the backward "
    "pass instead of keeping its activations, which saves memory only where a gradient flows through it (verl's "
    "update pass, which computes it unused); rlrig computes it only in the no-grad old-log-prob pass, a chunk of "
    "tokens at a time",
    "actor_rollout_ref.rollout.mode": "verl runs every rollout through its async agent loop (sync is removed from "
    "verl); rlrig's rollouts run through its agent loop (single_turn_agent, tool_agent or a loop of your own, by a "
    "row's agent_name or rollout.agent.default_agent_loop) in either mode",
    "actor_rollout_ref.rollout.multi_turn.enable": "verl's trainer stores it and picks no loop by it: a row's "
    "agent_name, else rollout.agent.default_agent_loop, picks single_turn_agent or tool_agent (rlrig says so at "
    "start when enable=True runs no tool_agent)",
    "actor_rollout_ref.rollout.agent.num_workers": "the number of verl's agent-loop actors; rlrig runs the loop in "
    "each engine's own worker",
    # verl's RolloutConfig declares them; nothing in verl reads them (b178a3cd)
    "actor_rollout_ref.rollout.over_sample_rate": "declared by verl and read by nothing: every sample is generated",
    "actor_rollout_ref.rollout.multi_stage_wake_up": "declared by verl and read by nothing: engines wake in one stage",
    "actor_rollout_ref.rollout.layered_summon": "rlrig always hands the engine one gathered tensor at a time",
    "actor_rollout_ref.rollout.calculate_log_probs": "rlrig's vLLM and SGLang engines always return them "
    "(training/rollout_probs_diff_*); hf computes none",
    "actor_rollout_ref.rollout.disable_log_stats": "vLLM's own statistics log; rlrig's metrics are the same",
    "actor_rollout_ref.rollout.skip_dump_dir": "read by verl only with rollout.skip_rollout=True, which rlrig refuses",
    **{
        f"actor_rollout_ref.rollout.prometheus.{k}": "read by verl only with rollout.prometheus.enable=True, "
        "which rlrig refuses"
        for k in ("port", "file", "served_model_name")
    },
    # critic
    "critic.model.use_shm": "rlrig loads the model from its path as it is",
    # reward_model
    "reward_model.strategy": "each of rlrig's reward-model workers holds the whole model (forward passes only, no "
    "gradients or optimizer state to shard)",
    "reward_model.model.use_remove_padding": "rlrig's reward model pads each micro batch to its longest sequence; the "
    "scores are the same",
    "reward_model.model.use_shm": "rlrig loads the model from its path as it is",
    "reward_model.model.use_fused_kernels": "the reward model computes no log-probs",
    **{
        f"reward_model.model.fsdp_config.{k}": "each of rlrig's reward-model workers holds the whole model "
        "(reward_model.strategy)"
        for k in ("wrap_policy.min_num_params", "reshard_after_forward", "fsdp_size", "forward_prefetch")
    },
    "reward_model.num_workers": "verl's reward-loop workers render and send requests to reward servers; rlrig "
    "renders in the workers that score, with no servers between",
    "reward_model.rollout.disable_log_stats": "vLLM's own statistics log; rlrig's metrics are the same",
    # trainer
    "trainer.ray_wait_register_center_timeout": "rlrig has no register-center actor to wait for; "
    "trainer.placement_timeout_s bounds the wait for its workers",
    # async_training and the copy verl's fully async config makes of its checkpoint engine
    **{
        f"{p}checkpoint_engine.{k}": "tunes verl's checkpoint-engine transport of fully async weight syncs; rlrig's "
        "weight sync is its own bucketed broadcast (rollout/weight_sync.py), and the weights that arrive are the same"
        for p in ("async_training.", "actor_rollout_ref.")
        for k in ("enable", "device_buffer_size_M", "overlap_broadcast_and_consume")
    },
    "actor_rollout_ref.checkpoint_engine": "verl's fully async config copies async_training.checkpoint_engine into "
    "it, which tunes verl's checkpoint-engine transport; rlrig's weight sync is its own bucketed broadcast",
    # the profilers
    **{
        f"global_profiler.global_tool_config.torch_memory.{k}": "verl reads it nowhere (its torch_memory profiler "
        "records context='all', stacks='all' with trace_alloc_max_entries and stack_depth), nor does rlrig"
        for k in ("context", "stacks", "kw_args")
    },
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
    "rollout.n_gpus_per_node": "verl's recipe default is 8; rlrig's is 1, as its trainer.n_gpus_per_node",
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": "verl's default is 2048; rlrig's "
    "is 512, smaller packing buffers for CPU runs (the weights that arrive are the same)",
}

# rlrig's own keys, with no verl counterpart.
RLRIG_ONLY = (
    "actor_rollout_ref.model.gguf_file",
    "critic.model.gguf_file",
    "actor_rollout_ref.rollout.cpu_kvcache_space_gb",
    "trainer.device",
    "trainer.seed",
    "actor_rollout_ref.rollout.multi_turn.tool_timeout",
    "trainer.wandb_proxy",
    "trainer.placement_timeout_s",
    "trainer.watchdog_factor",
    "trainer.watchdog_min_s",
    "trainer.async_mode",
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
    "distillation.placement.resource",
    *(f"{p}expert_parallel_size" for p in _FSDP),
)


def _merge_verl09() -> None:
    """verl 0.9's keys (verl09_keys.py) into the tables above; a key both take keeps its reason here and is taken
    at either release's default."""
    ALIASES.update(verl09_keys.ALIASES)
    groups = [*verl09_keys.AT_DEFAULT_ONLY, verl09_keys.DISTILLATION]
    for why, keys in groups:
        for key, default in keys.items():
            REFUSED.setdefault(key, why)
            ACCEPTED_DEFAULTS[key] = (*ACCEPTED_DEFAULTS.get(key, ()), default)
    for key, values in (*((k, (v,)) for k, v in verl09_keys.TARGETS.items()), *verl09_keys.ALSO_ACCEPTED.items()):
        ACCEPTED_DEFAULTS[key] = (*ACCEPTED_DEFAULTS.get(key, ()), *values)
    for key, why in verl09_keys.FILLED_ONLY.items():
        REFUSED.setdefault(key, why)
    NO_EFFECT.update(verl09_keys.NO_EFFECT)
    DEFAULTS_DIFFER.update(verl09_keys.DEFAULTS_DIFFER)


_merge_verl09()
# verl 0.9's free-form sections at a new place: every key under the old one's prefix
PREFIX_ALIASES = {
    "reward.reward_kwargs.": "reward_model.reward_kwargs.",
    "reward.custom_reward_function.reward_kwargs.": "custom_reward_function.reward_kwargs.",
}


def aliased(key: str) -> str:
    """The key rlrig stores for `key`: its alias (ALIASES, PREFIX_ALIASES), or the key itself."""
    if key in ALIASES:
        return ALIASES[key]
    prefix = next((p for p in PREFIX_ALIASES if key.startswith(p)), None)
    return PREFIX_ALIASES[prefix] + key[len(prefix) :] if prefix else key


MISSING = "???"  # OmegaConf's missing value: verl's configs write it for a key with no default


def not_given(key: str, value) -> bool:
    """True where verl 0.9 reads `key=value` as not given: OmegaConf's `???`, or null for an old reward key
    (reward_model.*, custom_reward_function.*, sandbox_fusion.*), which verl copies into reward.* only when set."""
    text = value.strip() if isinstance(value, str) else value
    if text == MISSING:
        return True
    return key in verl09_keys.LEGACY_UNSET and (text is None or (isinstance(text, str) and text in ("null", "~")))


# verl's own `${...}` defaults of keys it fills from another that rlrig reads instead, each taken as that text:
# {key: (verl 0.9's, an earlier release's)}. Another value is refused with the key's reason (REFUSED,
# REFUSED_PREFIXES), bar the values ACCEPTED_DEFAULTS lists.
_ACTOR_TOOL_CONFIG = "${oc.select:actor_rollout_ref.actor.profiler.tool_config,null}"
_FILLED_BEFORE_09 = {
    # verl b178a3c's and 0.7's
    "actor_rollout_ref.rollout.profiler.tool_config": _ACTOR_TOOL_CONFIG,
    "reward_model.profiler.tool_config": _ACTOR_TOOL_CONFIG,
    "reward_manager.name": "${oc.select:reward_model.reward_manager,naive}",
    "critic.model.tokenizer_path": '${oc.select:actor_rollout_ref.model.path,"~/models/deepseek-llm-7b-chat"}',
    # verl 0.7.1's, with no Megatron fallback yet
    "actor_rollout_ref.rollout.qat": "${oc.select:actor_rollout_ref.actor.fsdp_config.qat,null}",
}
FILLED = {
    key: tuple(t for t in (verl09_keys.FILLED.get(key), _FILLED_BEFORE_09.get(key)) if t)
    for key in {**verl09_keys.FILLED, **_FILLED_BEFORE_09}
}


def filled_by_verl(key: str, value) -> bool:
    """True for verl's own `${...}` default of a key verl fills from another that rlrig reads instead (FILLED)."""
    return isinstance(value, str) and value.strip() in FILLED.get(key, ())


def accepted_default(key: str, value: str) -> bool:
    return any(_same(value.strip(), d) for d in ACCEPTED_DEFAULTS.get(key, ()))


def _same(text: str, default: str) -> bool:
    try:
        return parse_literal(text) == parse_literal(default)
    except ConfigError:  # a path (~/...) or a list of names (a,b) as a YAML file writes them
        return text.strip("'\"") == default


def refusal(key: str, value: str) -> str | None:
    """Why `key=value` is refused, or None (a NO_EFFECT key at any value, under a refused prefix too)."""
    if accepted_default(key, value) or key in NO_EFFECT:
        return None
    why = REFUSED.get(key) or next((w for p, w in REFUSED_PREFIXES.items() if key.startswith(p)), None)
    if why is None and key.endswith("._target_"):
        why = "the dataclass verl builds this section into; rlrig accepts only verl's own"
    return f"{key}: a verl key rlrig does not implement: {why}" if why else None


def suggest(key: str, known: Iterable[str]) -> str | None:
    """The real key nearest to an unknown one: among the keys with the same last part, the one sharing the most
    trailing parts (`actor.optim.lr` is actor_rollout_ref.actor.optim.lr), then the closest by edit distance over the
    whole path; when no key has that last part, the closest of difflib's near matches; None when nothing is close."""
    known = list(known)
    parts = key.split(".")
    same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == parts[-1]]
    if same_leaf:
        return min(same_leaf, key=lambda k: (-_shared_tail(parts, k.split(".")), _distance(key, k), k))
    near = difflib.get_close_matches(key, known, n=5, cutoff=0.6)
    return min(near, key=lambda k: (_distance(key, k), k)) if near else None


def _shared_tail(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def _distance(a: str, b: str) -> int:
    """Levenshtein's edit distance."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]
