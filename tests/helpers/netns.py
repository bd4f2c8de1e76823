"""Test hosts in network namespaces on one bridge: several "nodes" with their own addresses.

Everything is named with a per-run prefix and removed by name; nothing is killed by pattern.
The subnet 10.<n>.0.0/24 stays on this machine: the bridge has no uplink and no route out. A subnet
already routed here (another suite on the same kernel, or a bridge a killed run left behind) is
stepped over: two bridges on one subnet would send the host's replies out of the wrong one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field

SUBNET_LOCK = "/tmp/rlrig-test-subnets.lock"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _routed_subnets() -> set[int]:
    """The n of every 10.n.0.0/24 this host already routes."""
    out = _ip("-4", "route", "show").stdout
    return {int(w.split(".")[1]) for w in out.split() if w.startswith("10.") and w.endswith(".0.0/24")}


def free_subnet(wanted: int) -> int:
    """`wanted`, or the next n up to 254 with no route here."""
    taken = _routed_subnets()
    for n in range(wanted, 255):
        if n not in taken:
            return n
    raise RuntimeError(f"no free 10.n.0.0/24 from n={wanted} to 254 for test hosts (`ip -4 route` lists them all)")


def available() -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "iproute2 (`ip`) is not installed"
    probe = f"rlp{uuid.uuid4().hex[:6]}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Netns:
    n: int
    subnet: int = 213
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    names: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"rlb{self.tag}"

    def ip(self, i: int) -> str:
        return f"10.{self.subnet}.0.{i + 1}"

    @property
    def bridge_ip(self) -> str:
        return f"10.{self.subnet}.0.254"

    def __enter__(self) -> Netns:
        # chosen and routed under a lock: tests run side by side (pytest-xdist) would otherwise both find a subnet
        # free and each put a bridge on it
        with open(SUBNET_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = free_subnet(self.subnet)
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        for i in range(self.n):
            name = f"rln{self.tag}{i}"
            self.names.append(name)
            _ip("netns", "add", name)
            host_end, ns_end = f"rlv{self.tag}{i}", f"rlp{self.tag}{i}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            _ip("link", "set", host_end, "master", self.bridge, "up")
            _ip("link", "set", ns_end, "netns", name)
            self.run_in(i, ["ip", "link", "set", "lo", "up"])
            self.run_in(i, ["ip", "link", "set", ns_end, "name", "eth0"])
            self.run_in(i, ["ip", "addr", "add", f"{self.ip(i)}/24", "dev", "eth0"])
            self.run_in(i, ["ip", "link", "set", "eth0", "up"])
        return self

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    def run_in(self, i: int, cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(self.prefix(i) + cmd, check=True, capture_output=True, text=True)

    def pids(self) -> list[int]:
        """Every process in these hosts' namespaces: what a test started there, not what tests beside it did."""
        return [int(p) for name in self.names for p in _ip("netns", "pids", name, check=False).stdout.split()]

    def cut(self, i: int) -> None:
        """Take node i off the network, as a dead host looks to the others."""
        _ip("link", "set", f"rlv{self.tag}{i}", "down")

    def limit(self, i: int, rate: str) -> None:
        """Slow what node i receives to `rate` (tc's units: "20mbit"): a token bucket on the bridge's end of its veth,
        which is where the bridge sends to it. What it sends goes out at full speed."""
        subprocess.run(
            [
                "tc",
                "qdisc",
                "add",
                "dev",
                f"rlv{self.tag}{i}",
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "32kbit",
                "latency",
                "400ms",
            ],
            check=True,
            capture_output=True,
            text=True,
        )

    def __exit__(self, *exc) -> None:
        for i, name in enumerate(self.names):
            # the pair goes with its host end at once; a namespace the kernel keeps alive a while
            # (a socket closing) would otherwise keep its veth, and the host end, with it
            _ip("link", "del", f"rlv{self.tag}{i}", check=False)
            _ip("netns", "del", name, check=False)
        _ip("link", "del", self.bridge, check=False)
