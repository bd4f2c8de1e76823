"""Where the head is and which of this node's addresses the head can reach."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from ..errors import RigError
from .nodespec import NodeSpec


@dataclass
class Interface:
    name: str
    addresses: list[tuple[str, int]]  # (ip, prefix length)
    up: bool = True


def resolve_host(host: str, source: str = "") -> str:
    """Resolve a name to one IP, IPv4 preferred (Ray and NCCL are most reliable on v4).

    `source` names the variable the name came from, for the error.
    """
    try:
        return str(ipaddress.ip_address(host.split("%")[0]))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        origin = f" (from {source})" if source else ""
        raise RigError(
            f"head address {host!r}{origin} does not resolve ({getattr(e, 'strerror', None) or e}); "
            "set RLRIG_HEAD_ADDRESS to the head's IP"
        ) from None
    v4 = [i[4][0] for i in infos if i[0] == socket.AF_INET]
    v6 = [i[4][0] for i in infos if i[0] == socket.AF_INET6]
    return (v4 or v6)[0]


def route_source_ip(dest: str, port: int) -> str:
    """The local address the kernel would use to reach dest: right with several NICs and bridges.

    A UDP connect sends nothing; it only asks the routing table.
    """
    family = socket.AF_INET6 if ":" in dest else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect((dest, port))
        except OSError as e:
            raise RigError(
                f"no route from this node to the head {dest} ({e.strerror}); check the network or RLRIG_HEAD_ADDRESS"
            ) from None
        return s.getsockname()[0]


def local_interfaces() -> list[Interface]:
    import psutil

    stats = psutil.net_if_stats()
    out = []
    for name, addrs in psutil.net_if_addrs().items():
        pairs = []
        for a in addrs:
            if a.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = a.address.split("%")[0]
            try:
                prefix = (
                    ipaddress.ip_network(f"{ip}/{a.netmask}", strict=False).prefixlen
                    if a.netmask
                    else (32 if "." in ip else 128)
                )
            except ValueError:  # a netmask in a form ipaddress rejects: count the address alone
                prefix = 32 if "." in ip else 128
            pairs.append((ip, prefix))
        out.append(Interface(name, pairs, stats[name].isup if name in stats else True))
    return out


def interface_of(ip: str, interfaces: list[Interface]) -> Interface | None:
    for itf in interfaces:
        if any(a == ip for a, _ in itf.addresses):
            return itf
    return None


def is_local_address(ip: str, interfaces: list[Interface]) -> bool:
    return ipaddress.ip_address(ip).is_loopback or interface_of(ip, interfaces) is not None


def format_hostport(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def resolve_spec(spec: NodeSpec, interfaces: list[Interface] | None = None) -> NodeSpec:
    """Fill head_address, node_ip and interface."""
    interfaces = local_interfaces() if interfaces is None else interfaces
    spec.head_address = resolve_host(spec.head_host, spec.sources.get("head_host", ""))
    head_ip = ipaddress.ip_address(spec.head_address)
    if spec.nnodes > 1 and head_ip.is_loopback:
        raise RigError(
            f"the head address {spec.head_host} is a loopback address but the job has {spec.nnodes} nodes; "
            "set RLRIG_HEAD_ADDRESS to an address the other nodes can reach"
        )
    if spec.node_ip_hint and interface_of(spec.node_ip_hint, interfaces):
        spec.node_ip = spec.node_ip_hint
    elif spec.is_head and is_local_address(spec.head_address, interfaces) and not head_ip.is_loopback:
        spec.node_ip = spec.head_address
    elif head_ip.is_loopback:
        spec.node_ip = spec.head_address
    else:
        spec.node_ip = route_source_ip(spec.head_address, spec.port)
    itf = interface_of(spec.node_ip, interfaces)
    spec.interface = itf.name if itf else ""
    return spec
