"""Which ports a node's Ray takes, so that runs sharing a host, or jobs sharing nodes, never meet.

Every port Ray would take at a fixed default (GCS 6379, dashboard and job API 8265, client server 10001, dashboard
agent 52365, the autoscaler's and the dashboard's metrics 44217 and 44227) is passed explicitly, and so is every
other one it opens (raylet, object manager, agents, metrics export):

- the head's ports, which the other nodes and clients must find (GCS, dashboard, client server):
  - a single-node run: free ports, picked here; no other node looks for them;
  - a multi-node run: derived from the launcher's job identity (a hash into HEAD_RANGE), so that every node of one
    job agrees without talking and two jobs on the same nodes differ;
  - a standing cluster (`rlrig up`): Ray's well-known ones, which `rlrig submit` and `ray` reach by default;
  - RLRIG_RAY_PORT (or the head address's `:port`) wins for the GCS in every case;
- each node's own ports: free ports, picked on that node.

Free ports come from the kernel (a bind to port 0), less those another rlrig run on this host has recorded
(cluster/runs.py); HEAD_RANGE lies between Ray's worker port range and Linux's ephemeral range, so that a port the
kernel hands out never lands in another job's derived block.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable, Collection, Mapping

from ..errors import RigError

# Ray's own defaults: its workers bind 10002-19999 when given a range, the kernel's ephemeral range starts at 32768
HEAD_RANGE = (20000, 32767)
HEAD_PORTS = ("gcs", "dashboard", "client_server")
NODE_PORTS = (
    "node_manager",
    "object_manager",
    "metrics_export",
    "dashboard_agent_listen",
    "dashboard_agent_grpc",
    "runtime_env_agent",
)
HEAD_ONLY_NODE_PORTS = ("autoscaler_metrics", "dashboard_metrics")  # processes that run on the head alone
WELL_KNOWN = {"gcs": 6379, "dashboard": 8265, "client_server": 10001}
FLAGS = {
    "dashboard": "--dashboard-port",
    "client_server": "--ray-client-server-port",
    "node_manager": "--node-manager-port",
    "object_manager": "--object-manager-port",
    "metrics_export": "--metrics-export-port",
    "dashboard_agent_listen": "--dashboard-agent-listen-port",
    "dashboard_agent_grpc": "--dashboard-agent-grpc-port",
    "runtime_env_agent": "--runtime-env-agent-port",
}
# Ray reads these two at import, with no `ray start` flag
ENV_VARS = {"autoscaler_metrics": "AUTOSCALER_METRIC_PORT", "dashboard_metrics": "DASHBOARD_METRIC_PORT"}
WHAT = {
    "gcs": "Ray's GCS",
    "dashboard": "the dashboard and job API",
    "client_server": "the Ray Client server",
    "node_manager": "the raylet",
    "object_manager": "the object manager",
    "metrics_export": "the metrics export",
    "dashboard_agent_listen": "the dashboard agent (HTTP)",
    "dashboard_agent_grpc": "the dashboard agent (gRPC)",
    "runtime_env_agent": "the runtime-env agent",
    "autoscaler_metrics": "the autoscaler's metrics",
    "dashboard_metrics": "the dashboard's metrics",
}
BLOCK = 4  # HEAD_RANGE is cut in blocks of this many ports, one block per job: HEAD_PORTS in order


def identity_key(launcher: str, job_id: str, head_host: str) -> str:
    """What names one multi-node job on every one of its nodes: the launcher's job id (Slurm's job and step, dstack's
    run name, ...), else the head's address as the launcher gave it (LeaderWorkerSet's leader, an explicit head)."""
    return f"{launcher}/{job_id or head_host}"


def derived_head_ports(key: str, span: tuple[int, int] = HEAD_RANGE) -> dict[str, int]:
    """The head's ports for the job named `key`: the same on every node, different for another key (but for one
    chance in the number of blocks, which then shows as a port already taken, not as a wrong cluster)."""
    lo, hi = span
    blocks = (hi - lo + 1) // BLOCK
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    base = lo + (h % blocks) * BLOCK
    return {name: base + i for i, name in enumerate(HEAD_PORTS)}


def kernel_free_port(host: str = "") -> int:
    """A port free here now: the kernel's pick for a bind to port 0."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pick_free(
    names: Collection[str], taken: Collection[int], draw: Callable[[], int] = kernel_free_port, tries: int = 200
) -> dict[str, int]:
    """One free port per name, none in `taken` (ports other runs here recorded) and no two alike."""
    out: dict[str, int] = {}
    avoid = set(taken)
    for name in names:
        for _ in range(tries):
            port = draw()
            if port not in avoid:
                break
        else:
            raise RigError(f"found no free port for {WHAT.get(name, name)} in {tries} tries; is the host out of ports?")
        out[name] = port
        avoid.add(port)
    return out


def choose(
    *,
    is_head: bool,
    nnodes: int,
    standing: bool,
    key: str,
    gcs_port: int | None,
    taken: Collection[int] = (),
    draw: Callable[[], int] = kernel_free_port,
) -> dict[str, int]:
    """Every port this node's Ray takes, by name (HEAD_PORTS on the head, NODE_PORTS everywhere, the head-only
    metrics on the head). `gcs_port`: an explicit GCS port (RLRIG_RAY_PORT, the head address's :port), else None.
    A worker needs the head's GCS port too, to join it."""
    if standing:
        head = dict(WELL_KNOWN)
    elif nnodes > 1:
        head = derived_head_ports(key)
    else:
        head = pick_free(HEAD_PORTS, taken, draw)
    if gcs_port is not None:
        head["gcs"] = gcs_port
    own = (*NODE_PORTS, *HEAD_ONLY_NODE_PORTS) if is_head else NODE_PORTS
    local = pick_free(own, {*taken, *head.values()}, draw)
    return {**(head if is_head else {"gcs": head["gcs"]}), **local}


def start_flags(ports: Mapping[str, int]) -> list[str]:
    """`ray start`'s flags for the ports in `ports` (the GCS's --port / --address are the caller's)."""
    return [f"{FLAGS[name]}={port}" for name, port in ports.items() if name in FLAGS]


def start_env(ports: Mapping[str, int]) -> dict[str, str]:
    """The ports Ray reads from the environment of `ray start`."""
    return {var: str(ports[name]) for name, var in ENV_VARS.items() if name in ports}


def holder(port: int) -> str:
    """Who listens on `port` here, as far as this host tells: `pid 123 (raylet)`, or "" when it does not say
    (another user's sockets need root to be read)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return ""
    for c in conns:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            try:
                return f"pid {c.pid} ({psutil.Process(c.pid).name()})"
            except psutil.Error:
                return f"pid {c.pid}"
    return ""


def is_free(port: int, host: str = "") -> bool:
    """Nothing listens on `port` here (a socket in TIME_WAIT, left by a closed connection, does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def taken_message(name: str, port: int, who: str) -> str:
    """The one line that refuses a head whose port is taken."""
    by = f" by {who}" if who else " by another process"
    return (
        f"port {port} ({WHAT.get(name, name)}) is already taken on this head{by}: another run or cluster uses it; "
        "stop it, or give this run another port with RLRIG_RAY_PORT (or RLRIG_JOB_ID for a different derived block)"
    )


def refuse_taken(
    ports: Mapping[str, int],
    free: Callable[[int], bool] = is_free,
    who: Callable[[int], str] = holder,
) -> None:
    """Raise RigError naming the first of the head's ports (GCS, dashboard, client server) that is taken here."""
    for name in HEAD_PORTS:
        port = ports.get(name)
        if port is not None and not free(port):
            raise RigError(taken_message(name, port, who(port)))
