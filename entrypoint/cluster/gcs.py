"""The head's GCS (key-value store and node table, token-protected) as a coordination.Store.

The one place that knows Ray's client and its exceptions: a failed connection becomes
errors.Unreachable, a refused token a RigError, and anything else propagates as the bug it is.
"""

from __future__ import annotations

import json
import socket
from contextlib import contextmanager

from ..errors import RigError, Unreachable
from .coordination import HOST_LABEL, RANK_LABEL

NS = b"rlrig"
ALIVE = 0  # GcsNodeInfo.state


def _connection_errors() -> tuple[type[BaseException], ...]:
    from ray.exceptions import RpcError

    # Ray 2.60's GcsClient raises RpcError when the GCS is not up yet or is gone (a timed-out or
    # failed gRPC call, measured against a killed head) and IOError for its IOError status;
    # OSError also covers socket errors and TimeoutError (ray's GetTimeoutError is one).
    return (RpcError, OSError)


@contextmanager
def _answering(address: str):
    try:
        yield
    except _connection_errors() as e:
        raise Unreachable(f"{address}: {e}") from e


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


class GcsStore:
    def __init__(self, client, address: str):
        self.client = client
        self.address = address

    @classmethod
    def open(cls, address: str) -> GcsStore:
        """Connect, or raise Unreachable. The port is probed first: Ray's client waits ~40 s on a closed one."""
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError

        host, port = address.rsplit(":", 1)
        if not _port_open(host.strip("[]"), int(port)):
            raise Unreachable(f"{address}: port closed")
        try:
            with _answering(address):
                return cls(GcsClient(address=address), address)
        except AuthenticationError:
            raise RigError(
                f"the head at {address} refused this node's token; set the same RLRIG_CLUSTER_TOKEN on every node"
            ) from None

    def put(self, key: str, value) -> None:
        with _answering(self.address):
            self.client.internal_kv_put(key.encode(), json.dumps(value).encode(), True, NS, timeout=5)

    def get(self, key: str, timeout: float = 2.0):
        with _answering(self.address):
            raw = self.client.internal_kv_get(key.encode(), NS, timeout=timeout)
        return None if raw is None else json.loads(raw)

    def keys(self, prefix: str) -> list[str]:
        with _answering(self.address):
            return [k.decode() for k in self.client.internal_kv_keys(prefix.encode(), NS, timeout=2)]

    def drain(self, node_id: str, message: str) -> None:
        from ray.core.generated import autoscaler_pb2

        # preemption: a drain Ray does not turn down for a busy node (it waits for it to be idle); no deadline
        reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
        with _answering(self.address):
            accepted, why = self.client.drain_node(node_id, reason, message, 0, timeout=5)
        if not accepted:
            raise RigError(f"Ray did not drain node {node_id}: {why}")

    def mark_job_failed(self, submission_id: str, message: str) -> bool:
        """Rewrite a stopped job's record as FAILED with `message`; False when there is no such job.

        Ray's job API can stop a job but only ever records that as STOPPED, and its own status
        update refuses to leave a terminal state; the record itself is a JSON JobInfo in the GCS
        key-value store (namespace `job`), which the dashboard, `ray job status` and the SDK all read.
        """
        from dataclasses import replace

        from ray._private.ray_constants import KV_NAMESPACE_JOB
        from ray.dashboard.modules.job.common import JobInfo, JobInfoStorageClient, JobStatus

        key = JobInfoStorageClient.JOB_DATA_KEY.format(job_id=submission_id).encode()
        with _answering(self.address):
            raw = self.client.internal_kv_get(key, KV_NAMESPACE_JOB, timeout=5)
            if raw is None:
                return False
            info = replace(JobInfo.from_json(json.loads(raw)), status=JobStatus.FAILED, message=message)
            self.client.internal_kv_put(key, json.dumps(info.to_json()).encode(), True, KV_NAMESPACE_JOB, timeout=5)
        return True

    def nodes(self, timeout: float = 2.0) -> dict[int, dict]:
        with _answering(self.address):
            infos = self.client.get_all_node_info(timeout=timeout).items()
        out: dict[int, dict] = {}
        for node_id, info in infos:
            rank = info.labels.get(RANK_LABEL)
            if rank is None:
                continue
            alive = info.state == ALIVE
            # A restarted node may leave a dead record behind: an alive one wins.
            if alive or int(rank) not in out:
                out[int(rank)] = {
                    "alive": alive,
                    "id": node_id.hex(),
                    "ip": info.node_manager_address,
                    "host": info.labels.get(HOST_LABEL, ""),
                    "resources": dict(info.resources_total),
                }
        return out
