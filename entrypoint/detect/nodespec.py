"""What one node knows about its place in the job, before anything is validated or started."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_RAY_PORT = 6379


@dataclass
class NodeSpec:
    launcher: str
    node_rank: int
    nnodes: int
    head_host: str  # as the launcher gave it: a name or an address
    port: int = DEFAULT_RAY_PORT  # the head's GCS: chosen by cluster/ports.py unless port_given
    port_given: bool = False  # set by RLRIG_RAY_PORT or the head address's :port, which win over any choice
    head_address: str = ""  # resolved IP, filled by addresses.resolve_spec
    node_ip: str = ""  # source address of the route to the head
    interface: str = ""  # interface that carries node_ip
    gpus_allotted: int | None = None  # what the launcher says this node got; None = not said
    cpus_allotted: int | None = None
    job_id: str = ""
    node_ip_hint: str = ""  # an address the launcher says is this node's
    node_name: str = ""  # what the launcher calls this node, where that is not its host name (Slurm: SLURMD_NODENAME)
    existing_ray: str = ""  # a Ray cluster that is already there (KubeRay, RAY_ADDRESS)
    ray_start_args: list[str] = field(default_factory=list)  # launcher-specific `ray start` flags
    # "node_rank" / "nnodes" / "head_host" -> the variable that gave it ("" = a default), so an
    # error names what the user can see in their own environment.
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def is_head(self) -> bool:
        return self.node_rank == 0
