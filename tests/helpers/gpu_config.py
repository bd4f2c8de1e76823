"""Overrides a config needs to parse as a GPU run on a machine without one: every pass's micro batch (a GPU run
without them is refused, as verl refuses it)."""

GPU_MICRO = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "critic.ppo_micro_batch_size_per_gpu=8",
]
