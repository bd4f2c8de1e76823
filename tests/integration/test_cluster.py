"""Real Ray clusters of network-namespace hosts, formed by `rlrig run` on every node."""

import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.cluster import dstack_env

pytestmark = pytest.mark.integration
CHECK = str(Path(__file__).with_name("check_cluster.py"))


def test_three_nodes_form_one_secure_cluster(cluster_hosts):
    ns = cluster_hosts(3)
    nodes = []
    for i in range(3):
        env = dstack_env(ns, i, "it3")
        if i == 0:
            env.update(RLRIG_ENV_FROM_HEAD_ENV="reached", EXIT_WITH="7")
        nodes.append(cluster_hosts.start(ns, i, env, ["run", "--", sys.executable, CHECK]))
    codes = [n.wait(240) for n in nodes]
    head = nodes[0].output
    assert "NODES 3" in head, head
    for i in range(3):
        # the head's RLRIG_ENV_* reached Ray workers on every node; Gloo got the route's interface
        assert f"WORKER {ns.ip(i)} reached eth0" in head, head
    assert "NO_TOKEN_DRIVER refused" in head, head
    assert codes == [7, 7, 7], [n.output for n in nodes]


def sleeping_pair(cluster_hosts, run: str):
    """Two nodes running a long command; returns (namespaces, head, worker) once it runs."""
    ns = cluster_hosts(2)
    head, worker = (cluster_hosts.start(ns, i, dstack_env(ns, i, run), ["run", "--", "sleep", "600"]) for i in range(2))
    head.wait_for("running: sleep", 120)
    return ns, head, worker


def test_worker_loss_stops_the_head(cluster_hosts):
    ns, head, worker = sleeping_pair(cluster_hosts, "itw")
    t0 = time.monotonic()
    ns.cut(1)
    code = head.wait(60)
    elapsed = time.monotonic() - t0
    assert code != 0
    assert "lost node rank 1 (10." in head.output, head.output
    assert elapsed < 30, elapsed
    # the cut-off worker notices it lost the head and cleans up on its own
    assert worker.wait(90) != 0
    assert "lost the head" in worker.output or "Ray exited" in worker.output, worker.output


def test_head_loss_stops_workers(cluster_hosts):
    ns, head, worker = sleeping_pair(cluster_hosts, "ith")
    t0 = time.monotonic()
    ns.cut(0)
    code = worker.wait(90)
    assert code != 0, worker.output
    assert time.monotonic() - t0 < 60
    assert head.wait(60) != 0


def test_sigterm_leaves_nothing_running(cluster_hosts):
    ns = cluster_hosts(1)
    node = cluster_hosts.start(ns, 0, {}, ["run", "--", "sleep", "600"])
    node.wait_for("running: sleep", 120)
    tree = psutil.Process(node.proc.pid).children(recursive=True)
    assert any("raylet" in " ".join(p.cmdline()) for p in tree if p.is_running())
    node.proc.terminate()
    assert node.wait(60) == 143
    time.sleep(1)
    left = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline() for p in left]


def test_worker_with_wrong_token_is_refused_and_named_missing(cluster_hosts):
    ns = cluster_hosts(2)
    head = cluster_hosts.start(ns, 0, dstack_env(ns, 0, "itt"), ["run", "--timeout", "40", "--", "true"])
    bad = cluster_hosts.start(
        ns, 1, {**dstack_env(ns, 1, "itt"), "RLRIG_CLUSTER_TOKEN": "c" * 64}, ["run", "--", "true"]
    )
    assert bad.wait(120) == 2
    assert "refused this node's token" in bad.output, bad.output
    # the refused worker never joined: the head names it when its wait is over
    assert head.wait(120) == 2
    assert "1/2 nodes joined" in head.output and "missing rank(s): 1" in head.output, head.output
