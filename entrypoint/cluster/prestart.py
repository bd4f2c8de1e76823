"""The variables that only count when they are in `ray start`'s environment.

Ray workers inherit the raylet's environment, and these are read when a worker starts or imports a
library (verl's FAQ: VLLM_ATTENTION_BACKEND "must be set before the `ray start` command"; "if in doubt,
print this env var in each rank"). Each node prints them as it starts Ray, and `rlrig doctor` shows them.
"""

from __future__ import annotations

from collections.abc import Mapping

# exact names, then prefixes
NAMES = (
    "RAY_DEBUG",
    "RAY_DEBUG_POST_MORTEM",
    "RAY_AUTH_MODE",
    "RAY_TMPDIR",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GLOO_SOCKET_IFNAME",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "TOKENIZERS_PARALLELISM",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_CACHE",
    "GPU_MAX_HW_QUEUES",
    "HSA_NO_SCRATCH_RECLAIM",
    "RLRIG_METRICS_HOST",
)
PREFIXES = ("VLLM_", "NCCL_", "TORCH_NCCL_", "RCCL_", "RAY_health_check_", "RAY_EXPERIMENTAL_NOSET_", "SGLANG_")
HIDDEN = ("RAY_AUTH_TOKEN",)  # never printed


def relevant(name: str, cluster: Mapping[str, str]) -> bool:
    """Listed by name or prefix, or sent to the cluster on purpose (.env, RLRIG_ENV_*)."""
    return name not in HIDDEN and (name in NAMES or name.startswith(PREFIXES) or name in cluster)


def select(ray_env: Mapping[str, str], cluster: Mapping[str, str]) -> dict[str, str]:
    return {k: ray_env[k] for k in sorted(ray_env) if relevant(k, cluster)}


def one_line(selected: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in selected.items()) or "(none)"
