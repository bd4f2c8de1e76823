"""What nodes tell each other through the head's key-value store, and in which order.

Keys: `env` (cluster environment, published by the head before workers start their raylets),
`node/<rank>` (each node's versions and GPUs, published before joining so a node that cannot join
can still be named), `exit` (the head's final exit code), `ack/<rank>` (a worker read it), `down`
(`rlrig down` asks a standing cluster's head to stop), `mode` (`up` on a standing cluster).

Every function here takes a `store` (the Store protocol below): the head's GCS through gcs.GcsStore
in production, an in-memory one in tests. A store raises errors.Unreachable, and only that, when the
head does not answer; that is the one error retried or read as "head lost" here. Anything else is a
bug and propagates.
"""

from __future__ import annotations

import platform
import socket
import time
from collections.abc import Callable
from importlib import metadata
from typing import Protocol

from ..errors import NodeLost, RigError, Unreachable

RANK_LABEL = "rlrig.io/node-rank"  # the Ray node label that maps Ray nodes to rlrig ranks
NNODES_LABEL = "rlrig.io/nnodes"  # how many nodes the cluster was started with
HOST_LABEL = "rlrig.io/host"  # the node's host name, for `rlrig status`
GPU_MODEL_LABEL = (
    "rlrig.io/gpu-model"  # the driver's GPU name, sanitized ("NVIDIA-H100-80GB-HBM3"); "none" without GPUs
)
LAUNCHER_LABEL = "rlrig.io/launcher"  # the launcher that started the node (slurm, dstack, local, ...)
NO_GPU = "none"  # GPU_MODEL_LABEL of a node without GPUs
POLL = 0.2
ENV, EXIT, DOWN, MODE = "env", "exit", "down", "mode"
STANDING = "up"  # the MODE of a cluster brought up by `rlrig up`


class Store(Protocol):
    """The head's key-value store and Ray's node table, as every function here reads them: gcs.GcsStore in
    production, tests/helpers/entrypoint_fakes.MemoryStore in tests. Each method raises errors.Unreachable, and only
    that, when the head does not answer (within `timeout` where one is taken); any other error is a bug."""

    def put(self, key: str, value) -> None:
        """Store `value` (anything JSON can hold) under `key`, replacing what was there."""

    def get(self, key: str, timeout: float = 2.0):
        """The value stored under `key`, or None when there is none."""

    def keys(self, prefix: str) -> list[str]:
        """Every key that starts with `prefix`."""

    def drain(self, node_id: str, message: str) -> None:
        """Ask Ray to drain the node (`nodes()`' "id"): nothing new is scheduled there, and it stops once idle."""

    def nodes(self, timeout: float = 2.0) -> dict[int, dict]:
        """rank -> {"alive": bool, "id": str, "ip": str, "host": str, "resources": {name: total}} for every node
        that joined with RANK_LABEL ("host" and "resources" may be missing). "id" is Ray's node id: a rank served
        by a restarted node keeps its rank and gets a new id."""
        ...


def node_key(rank: int) -> str:
    return f"node/{rank}"


def ack_key(rank: int) -> str:
    return f"ack/{rank}"


def drained_key(ip: str) -> str:
    """Why a standing cluster's head drained the node at `ip` (jobs/standing.py); by address, not rank, so that another
    machine joining as that rank is not turned away."""
    return f"drained/{ip}"


def node_facts(rank: int, ip: str, num_gpus: int, name: str = "") -> dict:
    """What every node tells the head about itself. `name`: what its launcher calls it (Slurm's node name, which
    `--exclude` takes), where that is not the host name (namespaces and containers share one)."""

    def ver(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "missing"

    return {
        "rank": rank,
        "ip": ip,
        "hostname": socket.gethostname(),
        "name": name or socket.gethostname(),
        "ray": ver("ray"),
        "python": platform.python_version(),
        "rlrig": ver("rlrig"),
        "gpus": num_gpus,
    }


def version_mismatches(facts: dict[int, dict]) -> list[str]:
    """One line per (field, node) that differs from the head's value."""
    head = facts.get(0)
    if not head:
        return []
    lines = []
    for key in ("ray", "python", "rlrig", "gpus"):
        for rank, f in sorted(facts.items()):
            if f.get(key) != head.get(key):
                lines.append(f"node {rank} ({f.get('ip')}) has {key} {f.get(key)} but the head has {head.get(key)}")
    return lines


def facts(store: Store) -> dict[int, dict]:
    out = {}
    for key in store.keys("node/"):
        value = store.get(key)
        if value is not None:
            out[int(value["rank"])] = value
    return out


def _nothing() -> None:
    pass


def connect(
    open_store: Callable[[], Store],
    deadline: float,
    what: str,
    address: str,
    check_alive: Callable[[], None] = _nothing,
    poll: float = POLL,
) -> Store:
    """Call `open_store` until the head answers. `check_alive` raises when waiting is pointless
    (this node's own Ray died)."""
    while True:
        check_alive()
        try:
            return open_store()
        except Unreachable:
            pass
        if time.monotonic() > deadline:
            raise RigError(
                f"{what}: no Ray head answered at {address} in time; check that rank 0 is running and the port is open"
            )
        time.sleep(max(0.0, min(poll, deadline - time.monotonic())))


# --- head -----------------------------------------------------------------------------------------


def publish_head(store: Store, cluster_env: dict[str, str], head_facts: dict) -> None:
    store.put(ENV, cluster_env)
    store.put(node_key(0), head_facts)


def wait_for_nodes(
    store: Store,
    nnodes: int,
    deadline: float,
    check_alive: Callable[[], None] = _nothing,
    poll: float = POLL,
    hint: str = "check those nodes' logs or raise --timeout",
    error: type[RigError] = RigError,
) -> dict[int, dict]:
    """Alive nodes once all `nnodes` joined; on timeout `error` naming the missing ranks, then `hint`. A GCS that
    misses a poll (busy starting, or on busy cores) is asked again at the next, up to the deadline."""
    while True:
        check_alive()
        try:
            nodes = {r: n for r, n in store.nodes().items() if n["alive"]}
            if len(nodes) >= nnodes:
                return nodes
            if time.monotonic() > deadline:
                raise error(_missing_message(store, nodes, nnodes, hint))
        except Unreachable as e:
            if time.monotonic() > deadline:
                raise error(f"the head's GCS did not answer in time ({e}); {hint}") from None
        time.sleep(poll)


def wait_for_rank(
    store: Store, rank: int, deadline: float, check_alive: Callable[[], None] = _nothing, poll: float = POLL
) -> None:
    """Until `rank`'s Ray node is alive (the head's own: a Ray driver started on the head attaches to it); a poll the
    GCS misses is asked again, up to the deadline."""
    while True:
        check_alive()
        try:
            if store.nodes().get(rank, {}).get("alive"):
                return
        except Unreachable:
            pass
        if time.monotonic() > deadline:
            raise RigError(
                f"rank {rank}'s Ray node did not register with the GCS in time; see the Ray logs in the temp dir"
            )
        time.sleep(poll)


def _missing_message(store: Store, nodes: dict[int, dict], nnodes: int, hint: str) -> str:
    missing = sorted(set(range(nnodes)) - set(nodes))
    known = facts(store)
    detail = []
    for r in missing:
        f = known.get(r)
        detail.append(f"{r} (reached the head from {f['ip']} but its raylet did not join)" if f else str(r))
    mism = version_mismatches(known)
    return (
        f"{len(nodes)}/{nnodes} nodes joined before the timeout; missing rank(s): {', '.join(detail)}"
        + (f"; {'; '.join(mism)}" if mism else "")
        + f"; {hint}"
    )


def check_versions(store: Store) -> None:
    mism = version_mismatches(facts(store))
    if mism:
        raise RigError("nodes differ: " + "; ".join(mism) + "; install the same versions on every node (one image)")


def describe(rank: int, known: dict[int, dict], ip: str = "") -> str:
    """`rank 1 (host, 10.0.0.2)`: how a node is named in logs and job messages."""
    f = known.get(rank, {})
    where = ", ".join(x for x in (f.get("name") or f.get("hostname", ""), ip or f.get("ip", "")) if x)
    return f"rank {rank} ({where})" if where else f"rank {rank}"


def node_changes(before: dict[int, bool], now: dict[int, dict]) -> tuple[list[int], list[int]]:
    """(ranks lost, ranks back) between two looks at the node table; `before` maps rank -> alive."""
    lost = [r for r, n in sorted(now.items()) if not n["alive"] and before.get(r)]
    lost += [r for r in sorted(before) if before[r] and r not in now]
    back = [r for r, n in sorted(now.items()) if n["alive"] and before.get(r) is False]
    return sorted(lost), back


# how long a GCS may not answer before the node asking it stops: a worker its head's (Plan.head_loss_timeout), the
# head its own
GCS_SILENT_S = 30.0


class Patience:
    """How long a node bears the GCS not answering while it polls it (the head watching its nodes as the command runs
    or the cluster serves; a worker waiting for its head's exit code), used as `with patience:` around one poll. A
    call the GCS misses (its 2 s deadline passes when the cores are busy) ends that poll only, and the next one asks
    again; a GCS silent for `silent_s` raises NodeLost (exit 3), worded by `lost` (given the last miss), since
    nothing can then tell whether the nodes are there."""

    def __init__(
        self,
        silent_s: float = GCS_SILENT_S,
        clock: Callable[[], float] = time.monotonic,
        lost: Callable[[Exception], str] | None = None,
    ):
        self.silent_s, self.clock = silent_s, clock
        self.lost = lost or (lambda e: f"the head's GCS has not answered for {silent_s:g}s ({e}); stopped the job")
        self.answered = clock()

    def __enter__(self) -> Patience:
        return self

    def __exit__(self, kind, error, tb) -> bool:
        if kind is None:
            self.answered = self.clock()
            return False
        if not issubclass(kind, Unreachable):
            return False
        if self.clock() - self.answered > self.silent_s:
            raise NodeLost(self.lost(error)) from None
        return True


def members(store: Store) -> dict[int, str]:
    """rank -> the id of the Ray node serving it, for the alive ranks: what `lost_since` compares against."""
    return {r: n.get("id", "") for r, n in store.nodes().items() if n["alive"]}


def lost_since(store: Store, before: dict[int, str]) -> dict[int, str]:
    """The ranks of `before` no longer served by the same Ray node: dead, gone, or already replaced by a restarted
    node (a launcher can restart a node faster than Ray declares the old one dead), each as `rank 1 (10.0.0.2)`."""
    now = store.nodes()
    lost = {}
    for rank, node_id in sorted(before.items()):
        n = now.get(rank)
        if n is None or not n["alive"] or n.get("id", "") != node_id:
            lost[rank] = f"rank {rank} ({(n or {}).get('ip', '?')})"
    return lost


def publish_exit(store: Store, code: int, wait: float = 10.0, poll: float = POLL) -> None:
    """Tell the workers how the job ended and give them a moment to read it before the GCS goes."""
    try:
        store.put(EXIT, code)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            alive = {r for r, n in store.nodes().items() if n["alive"] and r != 0}
            if all(store.get(ack_key(r)) is not None for r in alive):
                return
            time.sleep(poll)
    except Unreachable:
        pass  # the GCS is already gone; workers will notice the head is lost


# --- worker ---------------------------------------------------------------------------------------


def wait_for_env(store: Store, deadline: float, address: str, poll: float = POLL) -> dict[str, str]:
    """The head publishes the cluster environment right after its GCS comes up."""
    while True:
        try:
            cluster = store.get(ENV)
        except Unreachable:
            cluster = None  # the head may be restarting its GCS; the deadline decides
        if cluster is not None:
            return cluster
        if time.monotonic() > deadline:
            raise RigError(f"the head at {address} never published the cluster environment; is it an rlrig head?")
        time.sleep(poll)


def announce(store: Store, rank: int, my_facts: dict) -> None:
    store.put(node_key(rank), my_facts)


def wait_for_exit(
    store: Store,
    rank: int,
    address: str,
    head_loss_timeout: float,
    check_alive: Callable[[], None] = _nothing,
    poll: float = 0.5,
    ip: str = "",
) -> int:
    """The head's exit code, acknowledged; NodeLost when the head stops answering for too long, or drained this
    node (`ip`: this node's address): Ray would stop it only once idle, which it may never tell."""
    patience = Patience(
        head_loss_timeout, lost=lambda e: f"lost the head {address}: no answer for {head_loss_timeout:.0f}s"
    )
    while True:
        check_alive()
        code = drained = None
        with patience:
            code, drained = store.get(EXIT, timeout=2), (store.get(drained_key(ip)) if ip else None)
        if drained is not None:
            raise NodeLost(f"the head drained this node: {drained}; it is left out of the cluster")
        if code is not None:
            try:
                store.put(ack_key(rank), True)
            except Unreachable:
                pass  # the head did not wait for us; nothing is lost
            return int(code)
        time.sleep(poll)
