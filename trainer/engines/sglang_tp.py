"""SGLang over k workers (rollout.tensor_model_parallel_size = k > 1), as verl's hybrid SGLang rollout runs it:
k consecutive training workers form one engine. The first worker of the group on each node starts SGLang with
tp_size=k, nnodes and its node_rank, after pointing CUDA_VISIBLE_DEVICES at the GPUs of that node's members, so
SGLang's scheduler processes land on them; only the group's first worker talks to the engine (its other nodes'
Engine objects have no tokenizer manager). Generation: the group's prompts gathered, generated once, each worker
keeps its own. Weight sync: every worker hands over CUDA IPC handles of its own full tensors, the first gathers
them and SGLang's TP rank i opens the handles of worker i.

The GPU list is made per node, from that node's members only: joining the lists of two nodes gave the seed's
`0,1,0,1`, which points two schedulers at one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeLayout:
    nnodes: int
    node_rank: int  # this worker's node, in the order the group's ranks first appear on it
    devices: str  # CUDA_VISIBLE_DEVICES for this node's engine: its members' GPUs, sorted, each once
    starts_engine: bool  # the first member of the group on this node


def groups(world: int, k: int) -> list[list[int]]:
    """The engines' worker ranks: k consecutive ranks each (the same grouping as vLLM's TP in rlrig and verl's mesh)."""
    return [list(range(g, g + k)) for g in range(0, world, k)]


def node_layout(members: list[tuple[str, str]], me: int) -> NodeLayout:
    """members[i] = (node id, CUDA_VISIBLE_DEVICES) of the group's worker i; me: this worker's index in the group."""
    order: list[str] = []
    gpus: dict[str, list[str]] = {}
    for node, visible in members:
        if node not in gpus:
            order.append(node)
            gpus[node] = []
        gpus[node] += [d.strip() for d in visible.split(",") if d.strip()]
    sizes = {len(v) for v in gpus.values()}
    if len(sizes) != 1:
        per = ", ".join(f"{n}: {len(gpus[n])}" for n in order)
        raise ValueError(f"an SGLang engine over {len(members)} workers needs the same number of GPUs on each of its "
                         f"nodes, not {per}; make tensor_model_parallel_size divide trainer.n_gpus_per_node")
    for node in order:
        if len(set(gpus[node])) != len(gpus[node]):
            raise ValueError(f"workers of one SGLang engine on {node} see the same GPU ({','.join(gpus[node])}): each "
                             "worker must hold a GPU of its own (check CUDA_VISIBLE_DEVICES and Ray's GPU assignment)")
    node = members[me][0]
    first = next(i for i, (n, _) in enumerate(members) if n == node)
    devices = ",".join(sorted(gpus[node], key=lambda d: (not d.isdigit(), int(d) if d.isdigit() else 0, d)))
    return NodeLayout(len(order), order.index(node), devices, first == me)


def transpose(gathered: list[list[tuple[str, bytes]]]) -> list[tuple[str, list[bytes]]]:
    """[[(name, handle of rank 0)...], [(name, handle of rank 1)...]] -> [(name, [handle of rank 0, of rank 1])...]"""
    out = []
    for parts in zip(*gathered, strict=True):
        names = {name for name, _ in parts}
        if len(names) != 1:
            raise RuntimeError(f"the workers of one SGLang engine sent different tensors at once: {sorted(names)}")
        out.append((parts[0][0], [h for _, h in parts]))
    return out
