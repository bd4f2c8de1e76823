"""Everything one node will do, decided before it starts anything (bootstrap.plan builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cluster import auth, debugmode, raystart
from .cluster.coordination import GCS_SILENT_S
from .cluster.runs import Record
from .detect.addresses import format_hostport
from .detect.nodespec import NodeSpec
from .preflight.checks import Preflight


@dataclass(frozen=True)
class Plan:
    spec: NodeSpec
    command: list[str]  # empty for a standing cluster (`rlrig up`)
    base_env: dict[str, str]  # this process's environment: the bottom layer of every environment below
    preflight: Preflight = field(default_factory=Preflight)
    temp_dir: str = ""
    token: str = ""
    token_source: str = ""
    cluster_env: dict[str, str] = field(default_factory=dict)  # head: what it publishes; worker: empty
    ray_env: dict[str, str] = field(
        default_factory=dict
    )  # `ray start`'s environment (a worker's lacks the head's cluster env)
    start_command: list[str] = field(default_factory=list)
    wait_timeout: float = 300.0  # head: for all nodes to join; worker: for the head to come up
    head_loss_timeout: float = GCS_SILENT_S  # worker: GCS unreachable this long = head lost
    grace_period: float = 120.0  # on a stop signal: how long the command (head) and Ray (workers) may take to finish
    max_restarts: int = 0  # head: run the command again this many times after a node's loss; workers: rejoin
    rejoin_timeout: float = 300.0  # how long a restart waits for the lost ranks (head) or a new head (worker)
    fabric_check: bool = False  # head of a multi-node run/train: measure the network before the command (fabric/)
    fabric_min_ratio: float = 0.5  # a node below this x the median bandwidth fails the fabric check
    standing: bool = False  # `rlrig up`: serve submitted jobs until told to stop
    debug_env: dict[str, str] = field(default_factory=dict)  # --debug on this node's own line
    metrics_host: str = "127.0.0.1"  # where Ray's Prometheus endpoints listen
    dashboard_url: str = ""  # head: how this node reaches its own job API
    ports: dict[str, int] = field(default_factory=dict)  # every port this node's Ray takes, by name (cluster/ports.py)
    run: dict = field(default_factory=dict)  # the run's identity (cluster/identity.py): the head records, nodes check
    record: Record | None = None  # this process's entry in the host's runs folder (cluster/runs.py)

    @property
    def gcs_address(self) -> str:
        """The head's GCS: its own address on the head, the resolved head address on a worker."""
        ip = self.spec.node_ip if self.spec.is_head else self.spec.head_address
        return format_hostport(ip, self.spec.port)

    def worker_ray_env(self, cluster_env: dict[str, str]) -> dict[str, str]:
        """`ray start`'s environment on a worker once the head's cluster environment has arrived:
        the same layering as the head's, so a .env cannot replace this node's temp dir or token."""
        env = raystart.start_env(
            self.base_env,
            cluster_env,
            self.preflight,
            auth.ray_auth_env(self.token),
            self.temp_dir,
            self.debug_env,
            self.metrics_host,
            self.ports,
        )
        debugmode.check(env)
        return env

    def worker_start_command(self, ray_env: dict[str, str]) -> list[str]:
        """A worker learns from the head's environment whether the legacy debugger needs its flag."""
        return raystart.start_command(
            self.spec, self.preflight, self.temp_dir, "", debugmode.debugger_external(ray_env), self.ports
        )
