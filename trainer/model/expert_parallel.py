"""Expert parallelism for transformers' fused mixtures of experts (Qwen2/3-MoE, Mixtral, and every experts module
that holds `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] the way `use_experts_implementation` declares them):
each rank of a process group of `ep` ranks keeps E/ep consecutive experts of every layer (rank r experts
[r*E/ep, (r+1)*E/ep)), and a layer's forward sends each (token, expert) pair to the rank that owns the expert with
an all-to-all, runs the local experts there, and sends the outputs back the same way, where they are weighted by the
router's gates and summed per token as transformers' experts forward does.

The all-to-alls are torch.distributed.nn.functional's, which are differentiable: an expert's gradient on its owner
is the sum over every rank's tokens routed to it. With each rank's loss the mean of its own batch (data parallelism's
convention), that sum is `ep` times the gradient the data-parallel average gives the other parameters;
`finish_grads` divides expert gradients by `grad_divisor` (the data-parallel world that averages the others) so the
two agree. It does so after the backward rather than in a gradient hook: moving the module (param_offload) swaps its
parameters' tensors, and a hook on a tensor does not survive the swap.

In training (`fsdp_config.expert_parallel_size`, model/parallel.py fsdp_shard) the world is a (replicas, ep) mesh of
consecutive ranks, as torchtitan lays out expert parallelism: each row of `ep` ranks splits the experts, and the ranks
holding the same experts (one per row) sum their gradients (`finish_grads`) before the optimizer steps. An expert
shard is a DTensor sharded on the expert dimension over its row, so full tensors (weight sync, checkpoints), the
gradient norm and state dicts see the whole layer; FSDP2 shards every other parameter and leaves these alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn


def _default_gate(module: nn.Module) -> bool:
    """Whether the module gates as transformers' default does (act_fn(gate) * up over the halves of gate_up), which
    ExpertParallelExperts computes; a family with its own `_apply_gate` (a clamp, another split) is not split here."""
    from transformers.integrations.moe import _default_apply_gate

    return getattr(type(module), "_apply_gate", _default_apply_gate) is _default_apply_gate


def _fused_experts(module: nn.Module) -> bool:
    """True for an experts module in transformers' fused layout this file can shard (gated as transformers' default,
    concatenated, not transposed, no bias, no post-expert norm)."""
    return (
        isinstance(getattr(module, "gate_up_proj", None), nn.Parameter)
        and isinstance(getattr(module, "down_proj", None), nn.Parameter)
        and getattr(module, "num_experts", None) is not None
        and getattr(module, "has_gate", True)
        and getattr(module, "is_concatenated", True)
        and not getattr(module, "is_transposed", False)
        and not getattr(module, "has_bias", False)
        and not getattr(module, "has_post_expert_norm", False)
        and _default_gate(module)
    )


def experts_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, module) of every fused experts module of `model`, in module order."""
    return ((name, m) for name, m in model.named_modules() if _fused_experts(m))


def refusal(model: nn.Module, ep: int) -> str | None:
    """Why `model`'s experts cannot be split over `ep` ranks (asked of a weightless copy at start-up), or None."""
    found = [m for _, m in experts_modules(model)]
    if not found:
        return (
            f"{type(model).__name__} has no experts module in transformers' fused layout (gate_up_proj, down_proj) "
            "to split"
        )
    total = int(found[0].num_experts)
    return None if total % ep == 0 else f"the model's {total} experts do not split evenly over {ep} ranks"


def _a2a(x: torch.Tensor, send: list[int], recv: list[int], group) -> torch.Tensor:
    """Rows of `x` sent `send[r]` to rank r; the rows received, `recv[r]` from rank r, in rank order."""
    from torch.distributed.nn.functional import all_to_all_single

    out = x.new_empty((sum(recv), *x.shape[1:]))
    return all_to_all_single(out, x.contiguous(), recv, send, group=group)


class ExpertParallelExperts(nn.Module):
    """A fused experts module of which this rank holds experts [first, first + local): `forward(hidden_states [T, H],
    top_k_index [T, K], top_k_weights [T, K]) -> [T, H]` returns what the whole module's forward returns for these
    tokens, provided every rank of the mesh's row calls it for the same layer (each with its own tokens). An expert
    index outside [0, num_experts) (transformers' marker of a token routed nowhere) contributes nothing.
    `gate_up_proj` and `down_proj` are DTensors sharded on the expert dimension over `mesh` (1-D, the row), their
    local shards this rank's experts. `replicas`: the process group of the ranks holding the same experts (None:
    there are none), whose gradients finish_grads sums after dividing them by `grad_divisor`."""

    def __init__(self, experts: nn.Module, mesh, grad_divisor: float = 1.0, replicas=None):
        from torch.distributed.tensor import Shard, distribute_tensor  # where used: model/parallel.py says why

        super().__init__()
        ep, rank = mesh.size(), mesh.get_local_rank()
        total = int(experts.num_experts)
        if total % ep:
            raise ValueError(
                f"{total} experts do not split evenly over {ep} expert-parallel ranks; "
                "choose an expert-parallel size that divides the expert count"
            )
        self.group, self.replicas, self.grad_divisor = mesh.get_group(), replicas, grad_divisor
        self.ep, self.num_experts, self.local = ep, total, total // ep
        self.first = rank * self.local
        self.act_fn = experts.act_fn
        for name in ("gate_up_proj", "down_proj"):
            was = getattr(experts, name)
            shard = distribute_tensor(was.detach(), mesh, [Shard(0)], src_data_rank=None)
            setattr(self, name, nn.Parameter(shard, requires_grad=was.requires_grad))  # a frozen reference stays so

    def _local(self, x: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
        """Each row of `x` through the local expert `expert[row]` (ungated: the gates apply on the sender), in x's
        dtype (FSDP's policy casts the other weights, not these)."""
        gate_up, down = self.gate_up_proj.to_local(), self.down_proj.to_local()
        # every local expert in the graph, tokens or not: each rank then holds a gradient for every shard, and the
        # collectives over them (finish_grads, the gradient norm) see the same tensors on every rank. `x` too, even
        # with no rows: the backward must reach the all-to-all that brought them, which every other rank's backward
        # waits in (a rank no token was routed to would otherwise skip it and leave the others hanging); through an
        # empty slice of it, so that no value of x (an inf) reaches another row
        tied = gate_up.sum() + down.sum() + x[:0].sum()
        out = x.new_zeros((x.shape[0], down.shape[1])) + 0.0 * tied.to(x.dtype)
        for e in torch.unique(expert).tolist():
            rows = torch.where(expert == e)[0]
            gate, up = nn.functional.linear(x[rows], gate_up[e].to(x.dtype)).chunk(2, dim=-1)
            out = out.index_add(0, rows, nn.functional.linear(self.act_fn(gate) * up, down[e].to(x.dtype)))
        return out

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        k = top_k_index.shape[-1]
        expert = top_k_index.reshape(-1)
        token = torch.arange(hidden_states.shape[0], device=expert.device).repeat_interleave(k)
        gates = top_k_weights.reshape(-1)
        kept = (expert >= 0) & (expert < self.num_experts)
        expert, token, gates = expert[kept], token[kept], gates[kept]
        # pairs sorted by expert, so each rank's share is one consecutive run (experts are owned in ranges)
        order = torch.argsort(expert, stable=True)
        expert, token, gates = expert[order], token[order], gates[order]
        with torch.no_grad():
            per_expert = torch.bincount(expert, minlength=self.num_experts)
            from_each = torch.empty_like(per_expert)
            dist.all_to_all_single(from_each, per_expert, group=self.group)
            send = per_expert.view(self.ep, self.local).sum(1).tolist()
            from_each = from_each.view(self.ep, self.local)  # [source rank, local expert]
            recv = from_each.sum(1).tolist()
            local_expert = torch.arange(self.local, device=expert.device).repeat(self.ep)
            local_expert = local_expert.repeat_interleave(from_each.reshape(-1))
        arrived = _a2a(hidden_states[token], send, recv, self.group)
        returned = _a2a(self._local(arrived, local_expert), recv, send, self.group)
        weighted = returned * gates[:, None].to(returned.dtype)
        out = torch.zeros_like(hidden_states)
        return out.index_add(0, token, weighted.to(out.dtype))


def parallelize(model: nn.Module, mesh, grad_divisor: float = 1.0, replicas=None) -> list[str]:
    """Replace every fused experts module of `model` by its expert-parallel shard over the 1-D `mesh` (see
    ExpertParallelExperts); the names of the replaced modules. Every rank of `mesh` must hold the same weights
    (the full model, as loaded); each then keeps only its experts. Raises ValueError for a model without fused
    experts, or an expert count the mesh's size does not divide."""
    found = list(experts_modules(model))
    if not found:
        raise ValueError(f"{type(model).__name__} has no fused experts module (gate_up_proj, down_proj) to shard")
    for name, experts in found:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, ExpertParallelExperts(experts, mesh, grad_divisor, replicas))
    return [name for name, _ in found]


_MESHES: dict[tuple, object] = {}  # one (replicas, ep) mesh for the actor and the reference alike


def forget_meshes() -> None:
    """Before the process group goes: the meshes' groups go with it."""
    _MESHES.clear()


def shard_experts(model: nn.Module, ep: int, device_type: str) -> set[nn.Parameter]:
    """`model`'s experts split over rows of `ep` consecutive ranks of the world (fsdp_config.expert_parallel_size),
    their gradients averaged as data parallelism averages the other parameters'; the expert parameters, which FSDP2
    is to leave alone. Every rank calls it with the same `ep`, after the weights agree across ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    key = (world, ep, device_type)
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device_type, (world // ep, ep), mesh_dim_names=("replica", "ep"))
    mesh = _MESHES[key]
    replicas = mesh["replica"].get_group() if world > ep else None
    try:
        parallelize(model, mesh["ep"], grad_divisor=world, replicas=replicas)
    except ValueError as e:
        raise ValueError(f"fsdp_config.expert_parallel_size={ep}: {e}") from None
    return {p for m in model.modules() if isinstance(m, ExpertParallelExperts) for p in m.parameters()}


def finish_grads(model: nn.Module) -> None:
    """After the backward, before the gradient norm: each expert shard's gradient divided by its grad_divisor and
    summed over the ranks that hold the same experts (one per row of the mesh), as FSDP averages the other
    parameters' over every rank; nothing for a model without expert-parallel modules."""
    for m in model.modules():
        if not isinstance(m, ExpertParallelExperts):
            continue
        for p in m.parameters():
            if p.grad is None:
                continue
            local = p.grad.to_local()
            if m.grad_divisor != 1.0:
                local.div_(m.grad_divisor)
            if m.replicas is not None:
                dist.all_reduce(local, group=m.replicas)


def gather_experts(module: ExpertParallelExperts) -> dict[str, torch.Tensor]:
    """The whole layer's `gate_up_proj` and `down_proj` [E, ...], every rank of the module's row receiving them."""
    return {name: getattr(module, name).detach().full_tensor() for name in ("gate_up_proj", "down_proj")}
