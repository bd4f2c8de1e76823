"""Data-parallel wrapping (actor.strategy ddp | fsdp) and the full state every strategy shares.

Checkpoints hold full, unsharded tensors keyed by parameter name (torch.distributed.checkpoint's
"full state dict"), so a run saved with one strategy or world size resumes with another.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator

import torch
import torch.distributed as dist

from . import expert_parallel

# torch.distributed's DTensor, FSDP2 and checkpoint state dicts (seconds of import) are imported where they are used:
# the driver imports the worker modules for their classes alone, and the workers import these when they first need
# them
STRATEGIES = ("ddp", "fsdp")


def group_holding(rank: int, partition: list[list[int]]) -> tuple[object, list[int]]:
    """Every group of `partition` (lists of ranks) created, in order, as torch.distributed requires of every rank;
    the one holding `rank`, with its ranks."""
    mine = None
    for ranks in partition:
        g = dist.new_group(ranks)
        if rank in ranks:
            mine = g, ranks
    return mine


def gather_rows(t: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's rows in rank order (each rank holds as many); of `group`'s ranks (None: all)."""
    # not every backend gathers bool, and NCCL has no int16 (routed experts): gathered in a type it has
    kept = t.dtype
    t = t.to(torch.uint8) if kept == torch.bool else t.to(torch.int32) if kept == torch.int16 else t
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts).to(kept)


def broadcast_from_rank0(module: torch.nn.Module) -> None:
    # DDP does this itself; FSDP does not, and another node's copy of the model on disk need not match
    for t in itertools.chain(module.parameters(), module.buffers()):
        dist.broadcast(t.data, 0)


_MESHES: dict[tuple, object] = {}  # one mesh (and its process groups) for the actor, reference and critic alike


def forget_meshes() -> None:
    """Before the process group goes: the meshes' groups go with it."""
    _MESHES.clear()
    expert_parallel.forget_meshes()


def hsdp_mesh(fsdp_size: int, device_type: str):
    """verl's create_device_mesh: a (replicas, fsdp_size) mesh when fsdp_size is smaller than the world, else None
    (one shard group of every rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if fsdp_size < 0 or fsdp_size >= world:
        return None
    key = (world, fsdp_size, device_type)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(
            device_type, (world // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard")
        )
    return _MESHES[key]


def blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: the classes the model marks as not to be split (FSDP's units, activation offload's)."""
    names = set(getattr(module, "_no_split_modules", None) or ())
    return [m for m in module.modules() if m is not module and type(m).__name__ in names]


def compile_blocks(module: torch.nn.Module) -> None:
    """Each transformer block (`blocks`) through torch.compile, in place (Module.compile: the parameters' names and
    the state dict stay as they are), before fully_shard makes the blocks FSDP's units, as torchtitan's
    apply_compile does. The blocks of a model share their code, so one compiled graph serves all of them."""
    for block in blocks(module):
        block.compile()


def fsdp_shard(
    module: torch.nn.Module,
    mp_policy=None,
    fsdp_size: int = -1,
    reshard_after_forward: bool = True,
    offload_policy: bool = False,
    expert_parallel_size: int = 1,
) -> torch.nn.Module:
    """FSDP2: one unit per transformer block (the classes HF marks as not to be split), then the root;
    `mp_policy` (a MixedPrecisionPolicy) casts each unit's gathered parameters for its forward; `fsdp_size` below the
    world: hybrid sharding (sharded within groups of that many ranks, replicated across them).
    `reshard_after_forward` (fsdp_config's, as verl): each unit frees its gathered parameters after its forward and
    gathers them again for the backward. Where the shard group is one rank there is nothing to free (the shard is the
    whole tensor), and the regather is a copy and a cast of every parameter per micro batch: not done there.
    `offload_policy` (fsdp_config's, as verl's fsdp2 engine passes it): FSDP2's CPUOffloadPolicy, under which the
    shards and their gradients live in host memory (pinned where there is a GPU to copy them to) and the optimizer
    steps there; buffers stay on the device. `expert_parallel_size` above 1: a mixture of experts' experts split
    over rows of that many ranks first (model/expert_parallel.py), which FSDP2 then leaves alone."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    broadcast_from_rank0(module)
    kw = {"mp_policy": mp_policy} if mp_policy is not None else {}
    device_type = next(module.parameters()).device.type
    if expert_parallel_size > 1:
        kw["ignored_params"] = expert_parallel.shard_experts(module, expert_parallel_size, device_type)
    if offload_policy:  # pinned, as verl's, where there is a device to copy to (CPU runs compute where the shards are)
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device_type == "cuda")
    mesh = hsdp_mesh(fsdp_size, device_type)
    if mesh is not None:
        kw["mesh"] = mesh
    group = mesh.size(1) if mesh is not None else dist.get_world_size()
    kw["reshard_after_forward"] = reshard_after_forward and group > 1
    for block in blocks(module):
        fully_shard(block, **kw)
    fully_shard(module, **kw)
    return module


def buffers_synced_once(module: torch.nn.Module) -> dict:
    """DDP's keywords for buffers (a language model's rotary frequencies) broadcast from rank 0 once, when it wraps
    the module, and not before every forward, as FSDP never does: each of those broadcasts is a collective, a
    barrier between the ranks, twice per micro batch with the prefix grouper (a fifth of the update on two CPU
    ranks). Before torch 2.13 (forward_sync_buffers), broadcast_buffers=False also skipped the one at the wrap, so
    the buffers are broadcast here."""
    if "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    for b in module.buffers():
        dist.broadcast(b.data, 0)
    return {"broadcast_buffers": False}


def wrap(module: torch.nn.Module, device: torch.device, precision, fsdp_config) -> torch.nn.Module:
    """The module to call for training forwards: a DDP wrapper, or `module` itself sharded in place (`fsdp_config`:
    the role's fsdp_size and reshard_after_forward)."""
    if precision.strategy == "fsdp":
        fc = fsdp_config
        return fsdp_shard(
            module,
            precision.fsdp_policy(),
            fc.fsdp_size,
            fc.reshard_after_forward,
            fc.offload_policy,
            fc.expert_parallel_size,
        )
    if precision.strategy == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == "cuda" else None, **buffers_synced_once(module)
        )
        if precision.reduce_dtype == torch.bfloat16:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return ddp
    raise ValueError(f"actor_rollout_ref.actor.strategy={precision.strategy}: use one of {', '.join(STRATEGIES)}")


def full_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) on every rank, one at a time: a sharded parameter is all-gathered when reached,
    so a rollout engine takes the weights without the whole model gathered twice. Every rank must consume
    the whole iterator, in order."""
    for name, t in module.state_dict().items():
        yield name, on_mesh_device(t).full_tensor() if hasattr(t, "full_tensor") else t


def on_mesh_device(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor held in host memory (offload_policy) moved to its mesh's device, where the collectives that
    gather or reduce it run (NCCL takes no host tensors); anything else as it is."""
    mesh = getattr(t, "device_mesh", None)
    return t.to(mesh.device_type) if mesh is not None and t.device.type != mesh.device_type else t


def grad_norm_tensor(module: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """The gradients' total norm before clipping them to `max_norm`, on the device (reading it waits for the device).
    torch's clip_grad_norm_ in its two steps, the norm reduced on the mesh's device in between: under offload_policy
    the gradients are in host memory (verl's fsdp2_clip_grad_norm_ does the same)."""
    params = [p for p in module.parameters() if p.grad is not None]
    meshes: dict[object, list] = {}  # FSDP's, and expert parallelism's rows (model/expert_parallel.py)
    for p in params:
        meshes.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    if len(meshes) == 1:
        gn = on_mesh_device(torch.nn.utils.get_total_norm([p.grad for p in params]))
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, gn)
        return gn.full_tensor() if hasattr(gn, "full_tensor") else gn
    # each mesh's norm reduced over its own ranks, then combined; torch's clipping takes one mesh at a time
    norms = [on_mesh_device(torch.nn.utils.get_total_norm([p.grad for p in ps])) for ps in meshes.values()]
    gn = torch.stack([n.full_tensor() if hasattr(n, "full_tensor") else n for n in norms]).norm()
    from torch.distributed.tensor.experimental import implicit_replication

    with implicit_replication():
        for ps in meshes.values():
            torch.nn.utils.clip_grads_with_norm_(ps, max_norm, gn)
    return gn


def grad_norm(module: torch.nn.Module, max_norm: float) -> float:
    return float(grad_norm_tensor(module, max_norm))


def gather_state(
    module: torch.nn.Module, opt: torch.optim.Optimizer, model: bool = True, optim: bool = True
) -> tuple[dict | None, dict | None]:
    """Full model and optimizer state on rank 0 ({} elsewhere; None for one not asked for). A collective: every rank
    calls it with the same arguments."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    gather = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 gets the tensors, the others {}
    model_sd = get_model_state_dict(module, options=gather) if model else None
    optim_sd = get_optimizer_state_dict(module, opt, options=gather) if optim else None
    return model_sd, optim_sd


def load_state(
    module: torch.nn.Module, opt: torch.optim.Optimizer, model_sd: dict | None, optim_sd: dict | None
) -> None:
    """Every rank passes the same full state (read from the checkpoint; None: that part is not loaded); sharded
    modules keep their part."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    scatter = StateDictOptions(full_state_dict=True)  # every rank passes the full state; each keeps its shard
    if model_sd is not None:
        set_model_state_dict(module, model_sd, options=scatter)
    if optim_sd is not None:
        set_optimizer_state_dict(module, opt, optim_sd, options=scatter)
