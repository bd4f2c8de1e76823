import pytest

from rlrig.entrypoint.detect.hostlist import HostlistError, expand_hostlist

CASES = [
    ("node1", ["node1"]),
    ("node[1-2]", ["node1", "node2"]),
    ("tux[0-2,12]", ["tux0", "tux1", "tux2", "tux12"]),
    ("linux[0000-0002]", ["linux0000", "linux0001", "linux0002"]),
    ("gpu-[0,1],login5", ["gpu-0", "gpu-1", "login5"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("h1 h2,h3", ["h1", "h2", "h3"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("x.example.com,y[1-2].example.com", ["x.example.com", "y1.example.com", "y2.example.com"]),
]


@pytest.mark.parametrize("expr,hosts", CASES)
def test_expand(expr, hosts):
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize("expr", ["n[1-2", "n1-2]", "n[a-b]", "n[3-1]"])
def test_bad(expr):
    with pytest.raises(HostlistError):
        expand_hostlist(expr)
