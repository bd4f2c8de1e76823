"""Ray's three Prometheus endpoints on the address rlrig chooses instead of every interface.

Ray 2.60 binds them to all interfaces unless the node's own IP is loopback, and has no setting for it:
the autoscaler's (44217) and the dashboard's (44227) through prometheus_client, the dashboard agent's
(a random port) through its own exporter. All three create their server with wsgiref's `make_server`,
imported by name when their module loads. A `sitecustomize` on the PYTHONPATH of `ray start` (the
shim below) swaps `make_server` for one that replaces a wildcard host, before those modules load, in
those three processes only (told apart by the script they run); every other process, Ray workers and
job drivers included, is left alone. The endpoints need no token, so off loopback they would list the
cluster's nodes, actors and usage to anyone on the network.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

HOST_VAR = "RLRIG_METRICS_HOST"
# the scripts `ray start` runs for the processes that serve metrics (paths inside the ray package)
RAY_SERVERS = (
    "dashboard/dashboard.py",
    "dashboard/agent.py",
    "autoscaler/_private/monitor.py",
    "autoscaler/v2/monitor.py",
)
WILDCARDS = ("", "0.0.0.0", "::")

# Shadows any other sitecustomize on the path, so it runs that one too.
SHIM = """# Written by rlrig (entrypoint/cluster/metricsbind.py): binds Ray's metrics endpoints to $RLRIG_METRICS_HOST.
import importlib.machinery as _m
import importlib.util as _u
import os as _os
import sys as _sys

if _sys.argv and _sys.argv[0].replace(_os.sep, "/").endswith({servers!r}):
    try:
        from rlrig.entrypoint.cluster.metricsbind import install as _install
    except ImportError:  # rlrig is not importable by this interpreter: Ray keeps its own binding
        _install = None
    if _install is not None:
        _install(_sys.argv, _os.environ)

_here = _os.path.dirname(_os.path.abspath(__file__))
_spec = _m.PathFinder.find_spec("sitecustomize", [p for p in _sys.path if _os.path.abspath(p or ".") != _here])
if _spec is not None and _spec.loader is not None:
    _mod = _u.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
"""


def is_ray_server(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0].replace("\\", "/").endswith(RAY_SERVERS)


def bind_host(requested: str, host: str) -> str:
    """The host a server binds: `host` where Ray asked for every interface, else what Ray asked."""
    return host if requested in WILDCARDS else requested


def install(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Patch wsgiref in this process when it is one of Ray's metrics servers; True when patched."""
    host = env.get(HOST_VAR, "")
    if not host or not is_ray_server(argv):
        return False
    import wsgiref.simple_server as ws

    original = ws.make_server

    def make_server(requested, port, app, server_class=ws.WSGIServer, handler_class=ws.WSGIRequestHandler):
        chosen = bind_host(requested, host)
        if ":" in chosen and server_class.address_family != socket.AF_INET6:
            server_class = type(server_class.__name__, (server_class,), {"address_family": socket.AF_INET6})
        elif ":" not in chosen and server_class.address_family == socket.AF_INET6:
            server_class = type(server_class.__name__, (server_class,), {"address_family": socket.AF_INET})
        return original(chosen, port, app, server_class, handler_class)

    ws.make_server = make_server
    return True


def write_shim(directory: str) -> str:
    """Write the sitecustomize shim into `directory` (made if missing); returns the directory."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "sitecustomize.py").write_text(SHIM.format(servers=RAY_SERVERS))
    return str(path)
