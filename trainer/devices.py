"""Which of its node's GPUs a Ray worker holds, as a torch device index."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

# Ray's switches that leave the visible-devices variable alone: every worker then sees all the node's GPUs. The ROCm
# image sets the HIP one, as AMD's Ray guide does (ROCm libraries read it where CUDA's variable is ignored).
NOSET_FLAGS = {
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "CUDA_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "HIP_VISIBLE_DEVICES",
    "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "ROCR_VISIBLE_DEVICES",
}


def _noset_vars(env: Mapping[str, str]) -> list[str]:
    """The visible-devices variables that a NOSET flag leaves showing all of the node's GPUs."""
    return [var for flag, var in NOSET_FLAGS.items() if env.get(flag, "").lower() in ("1", "true")]


def _assigned_gpu(env: Mapping[str, str], assigned: Sequence[str] | None) -> str:
    """The node device id of the one GPU Ray assigned this worker."""
    if assigned is None:
        import ray

        assigned = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    if len(assigned) != 1:
        raise RuntimeError(
            f"a training worker holds one GPU, but Ray assigned {list(assigned)} under "
            f"{', '.join(f for f in NOSET_FLAGS if env.get(f))}"
        )
    return assigned[0]


def gpu_index(env: Mapping[str, str] | None = None, assigned: Sequence[str] | None = None) -> int:
    """0 when Ray narrows the visible devices to the worker's own GPU (its default). Under a NOSET flag the worker
    sees every GPU of the node, so its device is the one Ray assigned it (`assigned`: Ray's accelerator ids, which
    are the node's device ids), found by position in the visible list when one is set, else taken as the index."""
    env = os.environ if env is None else env
    flagged = _noset_vars(env)
    if not flagged:
        return 0
    own = _assigned_gpu(env, assigned)
    visible = next((env[var] for var in flagged if env.get(var)), "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    return ids.index(own) if ids else int(own)


def node_gpu_id(env: Mapping[str, str] | None = None, assigned: Sequence[str] | None = None) -> str:
    """This worker's GPU by the id its node's CUDA_VISIBLE_DEVICES would name it with: the one GPU Ray left visible
    (its default), or under a NOSET flag the one Ray assigned it; "" where neither names one GPU (no Ray narrowing,
    no flag), which callers refuse rather than pass on as an empty list that hides every GPU."""
    env = os.environ if env is None else env
    if _noset_vars(env):
        return _assigned_gpu(env, assigned)
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[0] if len(visible) == 1 else ""


def own_gpu_only(env: Mapping[str, str] | None = None, assigned: Sequence[str] | None = None) -> dict[str, str]:
    """The variables that show a child process only this worker's GPU (by the node's device id), where a NOSET flag
    shows the worker all of its node's GPUs (else {}: Ray already narrowed them). vLLM in a child places a one-GPU
    engine on the first visible GPU, which is another worker's there. ROCm's vLLM copies HIP_VISIBLE_DEVICES into
    CUDA_VISIBLE_DEVICES and refuses the two differing, so both are set."""
    env = os.environ if env is None else env
    flagged = _noset_vars(env)
    if not flagged:
        return {}
    own = _assigned_gpu(env, assigned)
    names = set(flagged) | ({"CUDA_VISIBLE_DEVICES"} if "HIP_VISIBLE_DEVICES" in flagged else set())
    return {var: own for var in sorted(names)}


def own_gpus_only(env: Mapping[str, str] | None = None, assigned: Sequence[str] | None = None) -> dict[str, str]:
    """own_gpu_only for a worker that holds several GPUs (an engine over them, as a distillation teacher's over
    tensor_model_parallel_size): under a NOSET flag the variables name every GPU Ray assigned it, else {}."""
    env = os.environ if env is None else env
    flagged = _noset_vars(env)
    if not flagged:
        return {}
    if assigned is None:
        import ray

        assigned = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    names = set(flagged) | ({"CUDA_VISIBLE_DEVICES"} if "HIP_VISIBLE_DEVICES" in flagged else set())
    return {var: ",".join(assigned) for var in sorted(names)}


def showing(gpus: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that show a child process the GPUs `gpus` (node device ids, comma-separated) of an engine over
    several workers: each variable a NOSET flag leaves naming all of the node's GPUs, and CUDA_VISIBLE_DEVICES beside
    them as own_gpu_only sets it. Not beside ROCR_VISIBLE_DEVICES alone: ROCm numbers CUDA_VISIBLE_DEVICES within
    the devices ROCR exposes, where node ids name the wrong ones."""
    env = os.environ if env is None else env
    flagged = set(_noset_vars(env))
    rocr_only = flagged == {"ROCR_VISIBLE_DEVICES"}
    return {var: gpus for var in sorted(flagged | (set() if rocr_only else {"CUDA_VISIBLE_DEVICES"}))}
