"""Where the trainer's workers go: pools of workers (the training workers; the reward model's own pool), each
one placement group per node of `per_node` bundles, checked against what the nodes offer before anything is
created, and placed within a bound: a placement that cannot be met is refused in one line, never waited on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Pool:
    role: str  # the config prefix it is set by, for messages
    nnodes: int
    per_node: int
    bundle: dict  # what each worker needs: {"GPU": 1, "CPU": 1, "<custom>": 1}
    # group i on the node labelled ranks[i] (the training pool, when nothing else decides): the lowest ranks alive,
    # so that a node gone from a standing cluster (drained, lost) leaves the next one in its place
    ranks: tuple[str, ...] = ()

    def group_need(self) -> dict:
        """What one of its placement groups needs on one node; custom resources first, so messages name them."""
        return {k: v * self.per_node for k, v in sorted(self.bundle.items(), key=lambda kv: kv[0] in ("CPU", "GPU"))}


@dataclass(frozen=True)
class Node:
    name: str  # "rank 1 (10.0.0.2)": how messages name it
    resources: dict
    rank: str | None = None  # the rlrig.io/node-rank label, where rlrig started the node


def bundle(use_gpu: bool, *resources: str | None, gpus: int = 1) -> dict:
    """What one worker needs: `gpus` GPUs (a worker holding an engine over several) and a CPU, and one unit of each
    custom resource named."""
    out = {"GPU": gpus, "CPU": 1} if use_gpu else {"CPU": 1}
    for r in resources:
        if r:
            out[r] = 1  # one unit, however many of the worker's roles ask for the same resource
    return out


def _fmt(res: dict) -> str:
    return ", ".join(
        f"{k} {v:g}" for k, v in sorted(res.items()) if not k.startswith(("node:", "memory", "object_store"))
    )


def _place(groups: list[tuple[Pool, dict, str | None]], free: list[dict], nodes: list[Node]) -> bool:
    """Backtracking: every group on one node with room for it (groups are few: one per node a pool spans)."""
    if not groups:
        return True
    pool, need, rank = groups[0]
    for i, node in enumerate(nodes):
        if rank is not None and node.rank != rank:
            continue
        if all(free[i].get(k, 0) >= v for k, v in need.items()):
            for k, v in need.items():
                free[i][k] -= v
            if _place(groups[1:], free, nodes):
                return True
            for k, v in need.items():
                free[i][k] += v
    return False


def check(pools: list[Pool], nodes: list[Node]) -> None:
    """Refuse, naming the resource, a set of pools the nodes cannot hold, counting each node's total resources."""
    listing = "; ".join(f"{n.name}: {_fmt(n.resources) or 'nothing'}" for n in nodes)
    for pool in pools:
        for k, v in pool.group_need().items():
            if not any(n.resources.get(k, 0) >= v for n in nodes):
                raise ConfigError(
                    f"{pool.role} needs {v:g} {k!r} on each of {pool.nnodes} node(s) ({pool.per_node} "
                    f"worker(s) of {pool.bundle}), and no node has that many: {listing}"
                )
    total = {}
    for pool in pools:
        for k, v in pool.group_need().items():
            total[k] = total.get(k, 0) + v * pool.nnodes
    for k, v in total.items():
        have = sum(n.resources.get(k, 0) for n in nodes)
        if have < v:
            raise ConfigError(
                f"the workers ({', '.join(p.role for p in pools)}) need {v:g} {k!r} in all and the "
                f"cluster has {have:g}: {listing}"
            )
    groups = [(p, p.group_need(), p.ranks[i] if p.ranks else None) for p in pools for i in range(p.nnodes)]
    groups.sort(key=lambda g: (g[2] is None, -sum(g[1].values())))  # pinned first, then the largest
    if not _place(groups, [dict(n.resources) for n in nodes], nodes):
        raise ConfigError(
            f"the workers ({', '.join(f'{p.role}: {p.nnodes} node(s) x {p.per_node} of {p.bundle}' for p in pools)}) "
            f"do not fit on the nodes together, one node per group: {listing}"
        )


def cluster_nodes() -> list[Node]:
    import ray

    out = []
    for n in ray.nodes():
        if n["Alive"]:
            rank = (n.get("Labels") or {}).get("rlrig.io/node-rank")
            name = f"rank {rank} ({n['NodeManagerAddress']})" if rank is not None else n["NodeManagerAddress"]
            out.append(Node(name, dict(n["Resources"]), rank))
    return out


def create(pools: list[Pool], timeout_s: float) -> list[list]:
    """Each pool's placement groups (one per node, packed), ready within timeout_s, or a one-line refusal."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes = cluster_nodes()
    check(pools, nodes)
    made = []
    for p in pools:
        groups = []
        for i in range(p.nnodes):
            selector = [{"rlrig.io/node-rank": p.ranks[i]}] * p.per_node if p.ranks else None
            groups.append(
                placement_group([p.bundle] * p.per_node, strategy="STRICT_PACK", bundle_label_selector=selector)
            )
        made.append(groups)
    flat = [g for groups in made for g in groups]
    ready, _ = ray.wait([g.ready() for g in flat], num_returns=len(flat), timeout=timeout_s)
    if len(ready) < len(flat):
        for g in flat:
            remove_placement_group(g)
        free = "; ".join(
            f"{n['NodeManagerAddress']}: {_fmt(n.get('Resources', {}))}" for n in ray.nodes() if n["Alive"]
        )
        raise ConfigError(
            f"the workers' placement "
            f"({', '.join(f'{p.role}: {p.nnodes} x {p.per_node} of {p.bundle}' for p in pools)}) "
            f"was not ready within trainer.placement_timeout_s={timeout_s:g} (other jobs may hold the "
            f"resources); the nodes: {free}"
        )
    return made
