"""Plain names the integration tests share (their fixtures stay in tests/integration/conftest.py)."""

from tests.helpers import netns

TOKEN = "a" * 64


def dstack_env(ns: netns.Netns, i: int, run: str) -> dict[str, str]:
    return {
        "DSTACK_NODE_RANK": str(i),
        "DSTACK_NODES_NUM": str(ns.n),
        "DSTACK_MASTER_NODE_IP": ns.ip(0),
        "DSTACK_NODES_IPS": "\n".join(ns.ip(j) for j in range(ns.n)),
        "DSTACK_RUN_NAME": run,
    }
