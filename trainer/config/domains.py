"""Each numeric key's allowed values, as one table checked at start-up (validation._domains).

Where verl itself refuses a value, the comment beside the entry names the file and the condition (verl b178a3c);
every other domain follows from what the key means. Keys whose every value means something are not listed:
trainer.save_freq and trainer.test_freq (<= 0 turns them off: verl's ray_trainer.py tests `freq > 0`),
optim.lr_warmup_steps (< 0: the ratio decides), actor.entropy_coeff (verl asserts nothing; below 0 it rewards
certainty), algorithm.pf_ppo.weight_pow (|score| ** pow: any power weighs). Keys checked together with other keys
(tensor parallelism, LoRA rank and alpha, a resource pool's size once enabled) stay with those checks in validation.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Domain:
    holds: Callable[[Any], bool]
    text: str  # completes "KEY=VALUE must be ..."
    nullable: bool = False  # null is allowed too: the key then follows another key or a computed default

    def refusal(self, key: str, value: Any) -> str | None:
        if value is None and self.nullable or value is not None and self.holds(value):
            return None
        return f"{key}={shown(value)} must be {self.text}{' (or null)' if self.nullable else ''}"


def shown(value: Any) -> str:
    """The value as the user would have typed it: 2 rather than the 2.0 a float key holds."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# comparisons are written so that NaN fails every one of them
def at_least(low: float, nullable: bool = False) -> Domain:
    return Domain(lambda v: v >= low, f"at least {low}", nullable)


def above(low: float, nullable: bool = False) -> Domain:
    return Domain(lambda v: v > low, "positive" if low == 0 else f"greater than {low}", nullable)


def interval(low: float, high: float, open_low: bool = False) -> Domain:
    bracket = "(" if open_low else "["
    return Domain(lambda v: (v > low if open_low else v >= low) and v <= high, f"in {bracket}{low}, {high}]")


def _names_a_file(value: Any) -> bool:
    # "" is the embedded data set; a list must name at least one file
    return not isinstance(value, list) or len(value) > 0


COUNT = at_least(1)
FSDP_CONFIGS = ("actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.model.fsdp_config")
COUNT_OR_NULL = at_least(1, nullable=True)
NON_NEGATIVE = at_least(0)
POSITIVE = above(0)
FRACTION = interval(0, 1)
SHARE = interval(0, 1, open_low=True)  # a share of something that must not be nothing (top_p, memory)
# -1 (vLLM's spelling) and 0 (transformers') both mean no top-k: verl's rollout.yaml says so of its default
TOP_K = Domain(lambda v: v >= -1, "at least -1 (-1 and 0 turn top-k off)")
FILES = Domain(_names_a_file, "a file or a non-empty list of files")


def _optim(prefix: str) -> dict[str, Domain]:
    return {
        f"{prefix}.lr": NON_NEGATIVE,
        # torch's AdamW raises ValueError when weight_decay < 0
        f"{prefix}.weight_decay": NON_NEGATIVE,
        # a norm bound: 0 would zero every gradient, a negative one turn it around
        f"{prefix}.clip_grad": POSITIVE,
        f"{prefix}.lr_warmup_steps_ratio": FRACTION,
        f"{prefix}.min_lr_ratio": FRACTION,
    }


def _sampling(prefix: str) -> dict[str, Domain]:
    return {
        f"{prefix}.n": COUNT,
        f"{prefix}.temperature": NON_NEGATIVE,  # 0 is greedy
        f"{prefix}.top_p": SHARE,
        f"{prefix}.top_k": TOP_K,
    }


DOMAINS: dict[str, Domain] = {
    "data.train_files": FILES,
    # verl's ray_trainer.py asserts len(self.val_dataloader) >= 1
    "data.val_files": FILES,
    "data.train_batch_size": COUNT,
    "data.val_batch_size": COUNT_OR_NULL,
    "data.gen_batch_size": COUNT_OR_NULL,
    # verl's v1 replay buffer: "max_inflight_gen_batches must be a positive integer"
    "algorithm.filter_groups.max_inflight_gen_batches": COUNT,
    "data.max_prompt_length": COUNT,
    "data.max_response_length": COUNT,
    **_optim("actor_rollout_ref.actor.optim"),
    # verl's core_algos.py compute_policy_loss_clip_cov: assert clip_cov_ratio > 0
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": POSITIVE,
    # verl's core_algos.py compute_policy_loss_kl_cov: assert kl_cov_ratio > 0
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": POSITIVE,
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": NON_NEGATIVE,
    "actor_rollout_ref.actor.ppo_mini_batch_size": COUNT,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": COUNT_OR_NULL,
    # verl's deprecated global micro batches (config/derived.py divides them by the GPUs)
    **dict.fromkeys(
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size",
            "actor_rollout_ref.ref.log_prob_micro_batch_size",
            "critic.ppo_micro_batch_size",
            "critic.forward_micro_batch_size",
        ),
        COUNT_OR_NULL,
    ),
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": COUNT,
    "actor_rollout_ref.actor.ppo_epochs": COUNT,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": COUNT,
    # verl's create_device_mesh: below 0 shards over every worker; 0 would divide by zero there
    **{f"{p}.fsdp_size": Domain(lambda v: v == -1 or v >= 1, "-1 or at least 1") for p in FSDP_CONFIGS},
    **{f"{p}.ulysses_sequence_parallel_size": COUNT for p in FSDP_CONFIGS},
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size": COUNT_OR_NULL,
    "critic.ulysses_sequence_parallel_size": COUNT,
    "critic.ppo_mini_batch_size": COUNT_OR_NULL,
    "critic.ppo_epochs": COUNT_OR_NULL,
    "actor_rollout_ref.actor.clip_ratio": NON_NEGATIVE,
    "actor_rollout_ref.actor.clip_ratio_low": at_least(0, nullable=True),
    "actor_rollout_ref.actor.clip_ratio_high": at_least(0, nullable=True),
    # verl's core_algos.py compute_policy_loss and compute_policy_loss_vanilla: assert clip_ratio_c > 1.0 (dual clip)
    "actor_rollout_ref.actor.clip_ratio_c": above(1),
    # SAPO's gate is sigmoid(tau (r - 1)) * 4 / tau
    "actor_rollout_ref.actor.tau_pos": POSITIVE,
    "actor_rollout_ref.actor.tau_neg": POSITIVE,
    # verl's compute_policy_loss_dro: raise ValueError unless dro_beta > 0 (loss_mode=dro needs it: algorithm_checks)
    "actor_rollout_ref.actor.policy_loss.dro_beta": above(0, nullable=True),
    "actor_rollout_ref.actor.kl_loss_coef": NON_NEGATIVE,
    **_sampling("actor_rollout_ref.rollout"),
    **_sampling("actor_rollout_ref.rollout.val_kwargs"),
    "actor_rollout_ref.rollout.max_num_batched_tokens": COUNT,
    "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": COUNT,
    # verl's TorchProfilerScheduleConfig: assert value >= 0
    **{
        f"{role}.profiler.tool_config.torch.schedule.{k}": NON_NEGATIVE
        for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
        for k in ("skip_first", "wait", "warmup", "active", "repeat")
    },
    "actor_rollout_ref.rollout.max_model_len": COUNT_OR_NULL,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": COUNT_OR_NULL,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": COUNT_OR_NULL,
    "actor_rollout_ref.rollout.gpu_memory_utilization": SHARE,
    "actor_rollout_ref.rollout.max_num_seqs": COUNT_OR_NULL,
    # verl takes null or 0 as no limit
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": at_least(0, nullable=True),
    "actor_rollout_ref.rollout.multi_turn.max_user_turns": at_least(0, nullable=True),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": COUNT,
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": COUNT,
    "actor_rollout_ref.rollout.multi_turn.tool_timeout": POSITIVE,
    "actor_rollout_ref.ref.nnodes": NON_NEGATIVE,  # 0 unless ref.enable_resource_pool (checked with it)
    "actor_rollout_ref.ref.n_gpus_per_node": NON_NEGATIVE,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": COUNT_OR_NULL,
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": COUNT_OR_NULL,
    "critic.nnodes": NON_NEGATIVE,
    "critic.n_gpus_per_node": NON_NEGATIVE,
    **_optim("critic.optim"),
    "critic.ppo_micro_batch_size_per_gpu": COUNT_OR_NULL,
    "critic.forward_micro_batch_size_per_gpu": COUNT_OR_NULL,
    "critic.ppo_max_token_len_per_gpu": COUNT,
    "critic.forward_max_token_len_per_gpu": COUNT_OR_NULL,
    "critic.cliprange_value": NON_NEGATIVE,
    "algorithm.gamma": FRACTION,
    "algorithm.lam": FRACTION,
    "algorithm.kl_ctrl.kl_coef": NON_NEGATIVE,
    "algorithm.kl_ctrl.target_kl": POSITIVE,  # the adaptive controller divides by it
    # verl's core_algos.py get_kl_controller: assert kl_ctrl.horizon > 0
    "algorithm.kl_ctrl.horizon": COUNT,
    # verl's rollout_corr_helper.py: raise ValueError if rollout_is_threshold <= 0
    "algorithm.rollout_correction.rollout_is_threshold": above(0, nullable=True),
    "reward_model.nnodes": NON_NEGATIVE,
    "reward_model.n_gpus_per_node": NON_NEGATIVE,
    "reward_model.micro_batch_size_per_gpu": COUNT_OR_NULL,
    "reward_model.max_length": COUNT_OR_NULL,
    "reward_model.forward_max_token_len_per_gpu": COUNT_OR_NULL,
    "reward_model.rollout.gpu_memory_utilization": SHARE,
    "reward_model.rollout.max_num_batched_tokens": COUNT,
    "reward_model.rollout.max_model_len": COUNT_OR_NULL,
    "reward_model.rollout.max_num_seqs": COUNT,
    "reward_model.rollout.prompt_length": COUNT,
    "reward_model.rollout.response_length": COUNT,
    "rollout.total_rollout_steps": COUNT_OR_NULL,  # prompts
    "rollout.total_epochs": COUNT,
    "trainer.nnodes": COUNT,
    "trainer.n_gpus_per_node": COUNT,
    "trainer.total_epochs": COUNT,
    "trainer.total_training_steps": COUNT_OR_NULL,
    "trainer.critic_warmup": NON_NEGATIVE,  # steps
    "trainer.log_val_generations": NON_NEGATIVE,
    "trainer.placement_timeout_s": POSITIVE,
    "trainer.watchdog_factor": at_least(1),
    "trainer.watchdog_min_s": POSITIVE,
    "actor_rollout_ref.nccl_timeout": POSITIVE,
    "ray_kwargs.ray_init.num_cpus": at_least(0, nullable=True),  # ray.init takes 0: a node that runs no tasks
    # verl's profiler/config.py TorchMemoryToolConfig: assert trace_alloc_max_entries > 0 and stack_depth > 0
    **{
        f"{prefix}.torch_memory.{key}": COUNT if prefix.startswith("global_profiler") else COUNT_OR_NULL
        for prefix in (
            "global_profiler.global_tool_config",
            "actor_rollout_ref.actor.profiler.tool_config",
            "actor_rollout_ref.ref.profiler.tool_config",
            "critic.profiler.tool_config",
        )
        for key in ("trace_alloc_max_entries", "stack_depth")
    },
}


def value_at(cfg: Any, key: str) -> Any:
    return functools.reduce(getattr, key.split("."), cfg)
