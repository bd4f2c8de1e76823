"""`rlrig train` on a cluster that is already there (a submitted job, or nested under `rlrig run`):
trainer.nnodes must be the cluster's node count. Fewer would leave nodes idle, more would wait for
placement groups that can never be placed; either way the one-line error says what to set."""

from __future__ import annotations

from .errors import RigError


def is_gcs_address(address: str) -> bool:
    """host:port (what Ray's job supervisor and `rlrig run` set), not `auto`, ray:// or a dashboard URL."""
    return "://" not in address and address.rsplit(":", 1)[-1].isdigit()


def mismatch(nnodes: int, alive_ranks: list[int], address: str) -> str | None:
    if not alive_ranks or len(alive_ranks) == nnodes:
        return None  # no rlrig ranks: a cluster rlrig did not start, whose nodes it cannot tell apart
    n = len(alive_ranks)
    return (f"trainer.nnodes={nnodes} but the cluster at {address} has {n} node(s) (ranks "
            f"{', '.join(map(str, sorted(alive_ranks)))}); set trainer.nnodes={n}")


def check_nnodes(address: str, nnodes: int) -> None:
    if not is_gcs_address(address):
        return
    from .gcs import GcsStore

    ranks = [r for r, n in GcsStore.open(address).nodes().items() if n["alive"]]
    problem = mismatch(nnodes, ranks, address)
    if problem:
        raise RigError(problem)
