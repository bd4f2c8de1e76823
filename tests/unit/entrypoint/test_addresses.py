import pytest

from rlrig.entrypoint.detect.addresses import Interface, format_hostport, resolve_host, resolve_spec
from rlrig.entrypoint.detect.nodespec import NodeSpec
from rlrig.entrypoint.errors import RigError

IFACES = [Interface("lo", [("127.0.0.1", 8), ("::1", 128)]), Interface("eth0", [("10.0.0.2", 24)])]


def test_resolve_literal_and_name():
    assert resolve_host("10.1.2.3") == "10.1.2.3"
    assert resolve_host("fd00::1") == "fd00::1"
    assert resolve_host("localhost") in ("127.0.0.1", "::1")


def test_unresolvable_name():
    with pytest.raises(RigError, match="RLRIG_HEAD_ADDRESS"):
        resolve_host("no-such-host.invalid")


def test_loopback_head_refused_for_multinode():
    with pytest.raises(RigError, match="loopback"):
        resolve_spec(NodeSpec("explicit", 1, 2, "127.0.0.1"), IFACES)


def test_head_uses_its_own_address():
    s = resolve_spec(NodeSpec("explicit", 0, 2, "10.0.0.2", node_ip_hint=""), IFACES)
    assert (s.head_address, s.node_ip, s.interface) == ("10.0.0.2", "10.0.0.2", "eth0")


def test_hint_wins_when_local():
    s = resolve_spec(NodeSpec("dstack", 1, 2, "10.0.0.1", node_ip_hint="10.0.0.2"), IFACES)
    assert s.node_ip == "10.0.0.2"


def test_route_source_for_worker():
    # The kernel picks the source address of the route: on this machine, towards loopback.
    s = resolve_spec(NodeSpec("local", 0, 1, "127.0.0.1"), IFACES)
    assert s.node_ip == "127.0.0.1" and s.interface == "lo"


@pytest.mark.parametrize("ip,port,out", [("10.0.0.1", 6379, "10.0.0.1:6379"), ("fd00::1", 1, "[fd00::1]:1")])
def test_format(ip, port, out):
    assert format_hostport(ip, port) == out
