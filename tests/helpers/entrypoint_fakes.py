"""Made-up machines and an in-memory head store for the entrypoint's unit tests."""

from __future__ import annotations

import json
import threading

from rlrig.entrypoint.detect.addresses import Interface
from rlrig.entrypoint.errors import Unreachable
from rlrig.entrypoint.preflight.inventory import Gpu, Inventory

GiB = 1024**3
UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"]
MODEL = "NVIDIA H100 80GB HBM3"  # as NVML names it


def machine(n_gpus=2, models=(MODEL,), **kw) -> Inventory:
    """`models`: the GPUs' models in turn (("A", "B") gives A, B, A, ...)."""
    base = dict(
        gpus=[
            Gpu(
                i,
                UUIDS[i % 2] if i < 2 else f"GPU-{i:08d}-0000-0000-0000-000000000000",
                "nvidia",
                models[i % len(models)],
            )
            for i in range(n_gpus)
        ],
        gpu_probe="NVML",
        interfaces=[
            Interface("lo", [("127.0.0.1", 8)]),
            Interface("eth0", [("10.0.0.2", 24)]),
            Interface("ib0", [("10.9.0.2", 24)]),
            Interface("docker0", [("172.17.0.1", 16)]),
        ],
        shm_bytes=64 * GiB,
        memory_bytes=100 * GiB,
        nofile_soft=65536,
        nofile_hard=65536,
        temp_free_bytes=100 * GiB,
        cpu_count=32,
    )
    base.update(kw)
    return Inventory(**base)


def collector(**kw):
    """A stand-in for inventory.collect(temp_dir, env) that reads nothing."""
    return lambda temp_dir, env: machine(**kw)


class MemoryStore:
    """coordination.Store in memory: the head's key-value store plus Ray's node table.

    `down = True` makes every call raise Unreachable, as a dead head's GCS does.
    """

    def __init__(self):
        self.kv: dict[str, str] = {}
        self.table: dict[int, dict] = {}
        self.joins = 0
        self.drained: list[tuple[str, str]] = []  # (node id, message), as drain() was asked
        self.down = False
        self.lock = threading.Lock()

    def _answer(self) -> None:
        if self.down:
            raise Unreachable("the head is gone")

    def put(self, key: str, value) -> None:
        self._answer()
        with self.lock:
            self.kv[key] = json.dumps(value)  # stored as JSON, as the GCS stores bytes

    def get(self, key: str, timeout: float = 2.0):
        self._answer()
        with self.lock:
            raw = self.kv.get(key)
        return None if raw is None else json.loads(raw)

    def keys(self, prefix: str) -> list[str]:
        self._answer()
        with self.lock:
            return [k for k in self.kv if k.startswith(prefix)]

    def drain(self, node_id: str, message: str) -> None:
        self._answer()
        self.drained.append((node_id, message))

    def nodes(self, timeout: float = 2.0) -> dict[int, dict]:
        self._answer()
        with self.lock:
            return {r: dict(n) for r, n in self.table.items()}

    # what a raylet joining or dying does to Ray's node table
    def join(self, rank: int, ip: str, host: str = "", resources: dict | None = None) -> None:
        with self.lock:
            # a rank that joins again is a new Ray node: a new id, as Ray gives a restarted raylet
            self.joins += 1
            self.table[rank] = {
                "alive": True,
                "id": f"node{self.joins}",
                "ip": ip,
                "host": host,
                "resources": dict(resources or {}),
            }

    def die(self, rank: int) -> None:
        with self.lock:
            self.table[rank]["alive"] = False
