"""What `rlrig train` checks of the trainer's config against the node before anything starts. MIG: NCCL between
MIG devices. On a cluster that is already there (a submitted job, or nested under `rlrig run`):
trainer.nnodes must be the cluster's node count, or with the reward model in its own pool, between that count less
the nodes of the pools of their own (reference, reward model) and the count (the pools may share nodes). Fewer would
leave nodes idle, more would wait for placement groups that can never be placed; either way the one-line error says
what to set."""

from __future__ import annotations

from .errors import RigError


def is_gcs_address(address: str) -> bool:
    """host:port (what Ray's job supervisor and `rlrig run` set), not `auto`, ray:// or a dashboard URL."""
    return "://" not in address and address.rsplit(":", 1)[-1].isdigit()


def mismatch(nnodes: int, alive_ranks: list[int], address: str, pool_nodes: int = 0) -> str | None:
    n = len(alive_ranks)
    if not alive_ranks or nnodes <= n <= nnodes + pool_nodes:
        return None  # no rlrig ranks: a cluster rlrig did not start, whose nodes it cannot tell apart
    pool = f" and {pool_nodes} node(s) in pools of their own" if pool_nodes else ""
    return (
        f"trainer.nnodes={nnodes}{pool} but the cluster at {address} has {n} node(s) (ranks "
        f"{', '.join(map(str, sorted(alive_ranks)))}); set trainer.nnodes={max(1, n - pool_nodes)}"
    )


def check_mig(mig_devices: int, n_gpus_per_node: int, device: str) -> None:
    """NCCL has no transport between MIG devices: training workers on several MIG devices of a node cannot talk."""
    if mig_devices > 1 and n_gpus_per_node > 1 and device != "cpu":
        raise RigError(
            f"this node's CUDA_VISIBLE_DEVICES names {mig_devices} MIG devices and trainer.n_gpus_per_node="
            f"{n_gpus_per_node}: NCCL does not run between MIG devices; use trainer.n_gpus_per_node=1 (one MIG "
            "device a node, NCCL across nodes) or whole GPUs"
        )


def check_nnodes(address: str, nnodes: int, pool_nodes: int = 0) -> None:
    if not is_gcs_address(address):
        return
    from .cluster.gcs import GcsStore

    ranks = [r for r, n in GcsStore.open(address).nodes().items() if n["alive"]]
    problem = mismatch(nnodes, ranks, address, pool_nodes)
    if problem:
        raise RigError(problem)
