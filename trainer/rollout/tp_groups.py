"""Engines that span k consecutive training workers (rollout.tensor_model_parallel_size, and the reward loop's
reward_model.rollout.tensor_model_parallel_size), as verl groups them: which workers form an engine, and for each
node of a group the GPUs its engine process must see.

The first worker of the group on a node starts the engine there after pointing CUDA_VISIBLE_DEVICES at the GPUs
of that node's members, so the engine's own processes land on them (the worker's CUDA context is made already;
it keeps its one GPU). The list is made per node, from that node's members only: joining the lists of two nodes
gave the seed's `0,1,0,1`, which points two of SGLang's schedulers at one GPU.
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


def node_layout(members: list[tuple[str, str]], me: int, on_gpus: bool = True) -> NodeLayout:
    """members[i] = (node id, its GPU's id on that node, devices.node_gpu_id) of the group's worker i; me: this
    worker's index in the group. On GPUs a member that names no GPU is refused: its "" would hide every GPU from the
    engine's processes."""
    unnamed = [i for i, (_, gpu) in enumerate(members) if not gpu.strip()]
    if on_gpus and unnamed:
        raise ValueError(
            f"workers {unnamed} of an engine over {len(members)} workers name no GPU of their own (Ray narrows "
            "CUDA_VISIBLE_DEVICES to one GPU, or a RAY_EXPERIMENTAL_NOSET_* flag with Ray's GPU assignment)"
        )
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
        raise ValueError(
            f"an engine over {len(members)} workers needs the same number of GPUs on each of its "
            f"nodes, not {per}; make tensor_model_parallel_size divide trainer.n_gpus_per_node"
        )
    for node in order:
        if len(set(gpus[node])) != len(gpus[node]):
            raise ValueError(
                f"workers of one engine on {node} see the same GPU ({','.join(gpus[node])}): each "
                "worker must hold a GPU of its own (check CUDA_VISIBLE_DEVICES and Ray's GPU assignment)"
            )
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
            raise RuntimeError(f"the workers of one engine sent different tensors at once: {sorted(names)}")
        out.append((parts[0][0], [h for _, h in parts]))
    return out


def make_group(k: int):
    """This worker's (Gloo group, index in it, its ranks) among k-worker engines; every rank must call this, since
    every rank takes part in making every group."""
    import torch.distributed as dist

    rank, mine = dist.get_rank(), None
    for ranks in groups(dist.get_world_size(), k):
        g = dist.new_group(ranks, backend="gloo")
        if rank in ranks:
            mine = (g, ranks.index(rank), ranks)
    return mine


def gather_share(group, me: int, size: int, items: list) -> tuple[list, slice]:
    """All of the group's items in rank order, and where this worker's own lie in them."""
    import torch.distributed as dist

    per_rank = [None] * size
    dist.all_gather_object(per_rank, items, group=group)
    start = sum(len(p) for p in per_rank[:me])
    return [x for part in per_rank for x in part], slice(start, start + len(items))


def with_devices(devices: str | None, start):
    """start() with the processes it spawns shown the GPUs `devices` (None: as they are), then this worker's own
    variables restored, so what it starts later sees its own GPU again. The variables are devices.showing's:
    CUDA_VISIBLE_DEVICES and each one a NOSET flag leaves naming the node's GPUs (ROCm's HIP_VISIBLE_DEVICES, which
    its engines refuse to differ from CUDA_VISIBLE_DEVICES)."""
    import os

    from ..devices import showing

    if devices is None:
        return start()
    shown = showing(devices)
    own = {var: os.environ.get(var) for var in shown}
    os.environ.update(shown)
    try:
        return start()
    finally:
        for var, value in own.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def where() -> tuple[str, str]:
    """(Ray's id of this worker's node, its IP)."""
    import ray

    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


class SharedEngine:
    """One engine over the devices of k consecutive training workers (k > 1), as verl's replicas span k GPUs: the
    reward loop's scorer (reward_model.rollout.tensor_model_parallel_size) and the colocated vLLM distillation
    teacher. The group's first worker starts it, start(its node's GPUs, comma-separated node device ids; None on
    CPU), and answers every member's requests; each member gets its own answers back.

    Contract: every member constructs it and calls ask() at the same time and as often (each is a collective of the
    group); the engine has close(). A failure on the first worker (the engine's start, a request) is raised on every
    member with its message, so none waits on the others."""

    def __init__(self, k: int, on_gpus: bool, start, key: str):
        """key: the config key that sets k, for messages."""
        import torch.distributed as dist

        from ..devices import node_gpu_id

        self.group, self.me, self.members = make_group(k)
        members = [None] * k
        dist.all_gather_object(members, (where()[0], node_gpu_id() if on_gpus else ""), group=self.group)
        try:
            layout = node_layout(members, self.me, on_gpus=on_gpus)
        except ValueError as e:
            raise RuntimeError(f"{key}={k}: {e}") from None
        if layout.nnodes > 1:  # the config allows only groups within a node; vLLM's mp executor stays on one
            raise RuntimeError(f"{key}={k}: its workers are on {layout.nnodes} nodes")
        self.engine = None

        def begin() -> None:
            self.engine = start(layout.devices if on_gpus else None)

        self._from_leader(begin)

    def ask(self, items: list, call) -> list:
        """call(engine, every member's items in rank order) -> one answer per item, on the first member; this
        member's own answers, in its order."""
        asked, mine = gather_share(self.group, self.me, len(self.members), items)
        return self._from_leader(lambda: call(self.engine, asked) if asked else [])[mine]

    def _from_leader(self, act):
        """act()'s value on the first member, sent to every member; its error, if any, raised on every member."""
        import torch.distributed as dist

        said = [(None, None)]
        if self.me == 0:
            try:
                said = [(None, act())]
            except Exception as e:  # noqa: BLE001 - raised on every member below
                said = [(str(e) or type(e).__name__, None)]
        dist.broadcast_object_list(said, src=self.members[0], group=self.group)
        error, value = said[0]
        if error is not None:
            raise RuntimeError(error)
        return value

    def close(self) -> None:
        """Stops the engine, where this member runs it."""
        if self.engine is not None:
            self.engine.close()
