"""What nodes tell each other through the head's GCS key-value store (token-protected).

Keys in namespace `rlrig`: `env` (cluster environment, published by the head before workers
start their raylets), `node/<rank>` (each node's versions and GPUs, published before joining so a
node that cannot join can still be named), `exit` (the head's final exit code).
"""

from __future__ import annotations

import json
import platform
import socket
from importlib import metadata

NS = b"rlrig"
RANK_LABEL = "rlrig.io/node-rank"
ALIVE = 0  # GcsNodeInfo.state


def node_facts(rank: int, ip: str, num_gpus: int) -> dict:
    def ver(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "missing"

    return {
        "rank": rank,
        "ip": ip,
        "hostname": socket.gethostname(),
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


class Kv:
    def __init__(self, address: str):
        from ray._raylet import GcsClient

        self.client = GcsClient(address=address)

    def put(self, key: str, value) -> None:
        self.client.internal_kv_put(key.encode(), json.dumps(value).encode(), True, NS, timeout=5)

    def get(self, key: str, timeout: float = 2.0):
        raw = self.client.internal_kv_get(key.encode(), NS, timeout=timeout)
        return None if raw is None else json.loads(raw)

    def facts(self) -> dict[int, dict]:
        keys = self.client.internal_kv_keys(b"node/", NS, timeout=2)
        out = {}
        for k in keys:
            v = self.get(k.decode())
            if v is not None:
                out[int(v["rank"])] = v
        return out

    def nodes(self, timeout: float = 2.0) -> dict[int, dict]:
        """rank -> {alive, ip} for every node started by rlrig (Ray's own label)."""
        out = {}
        for info in self.client.get_all_node_info(timeout=timeout).values():
            rank = info.labels.get(RANK_LABEL)
            if rank is None:
                continue
            alive = info.state == ALIVE
            # A restarted node may leave a dead record behind: an alive one wins.
            if alive or int(rank) not in out:
                out[int(rank)] = {"alive": alive, "ip": info.node_manager_address}
        return out
