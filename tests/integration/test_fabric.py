"""The fabric check on real namespace nodes: before `rlrig run` runs the command on several nodes, the head measures
the network between them (entrypoint/fabric/) and stops with exit 2 naming a node that is clearly slower (with
restarts left: at that node's second failure)."""

import json
import re
import sys
import time

import pytest

from tests.helpers.cluster import dstack_env

pytestmark = pytest.mark.integration


def run_three(
    cluster_hosts, run: str, slow: str = "", options: tuple[str, ...] = (), command: tuple[str, ...] = ("true",)
):
    """Three nodes running `rlrig run [options] -- COMMAND`, node 2 receiving at `slow` (tc's rate) when given;
    returns (namespaces, exit codes, the head's output)."""
    ns = cluster_hosts(3)
    if slow:
        ns.limit(2, slow)
    nodes = [cluster_hosts.start(ns, i, dstack_env(ns, i, run), ["run", *options, "--", *command]) for i in range(3)]
    codes = [n.wait(180) for n in nodes]
    return ns, codes, nodes[0].output


def report_of(head: str) -> dict:
    path = re.search(r"fabric: .*; report (\S+)", head)
    assert path, head
    with open(path.group(1)) as f:
        return json.load(f)


def test_a_good_fabric_passes_and_writes_its_report(cluster_hosts):
    t0 = time.monotonic()
    doctor = (sys.executable, "-m", "rlrig.entrypoint.cli", "doctor", "--json")  # the command: what it sees
    ns, codes, head = run_three(cluster_hosts, "itfok", command=doctor)
    assert codes == [0, 0, 0], head
    for i in range(3):  # one line per node: rank, host, IP, then MB/s and ms for the pairs with the head
        line = next((x for x in head.splitlines() if f"fabric: rank {i} (" in x), "")
        assert ns.ip(i) in line, head
        if i:
            assert re.search(r"\d+\.\d MB/s .*round trip \d+\.\d\d ms", line), line
    assert "fabric check passed" in head and "running: " in head, head
    report = report_of(head)
    # the check's time in the head's line and in doctor's JSON inside the command
    assert re.search(r"fabric check passed \(\d+\.\d+s after the nodes formed\)", head), head
    seen = json.loads(next(x for x in head.splitlines() if x.startswith('{"launcher"')))["fabric_check"]
    assert seen["verdict"] == "passed" and seen["seconds"] == report["seconds"], seen
    assert set(seen["phases_s"]) >= {"start", "pairs", "allreduce"}, seen
    assert report["verdict"] == "passed" and report["backend"] == "tcp", report
    assert [n["rank"] for n in report["nodes"]] == [0, 1, 2]
    assert all(n["mb_s"] > 0 and n["rtt_ms"] > 0 for n in report["nodes"][1:]), report
    assert report["median_mb_s"] > 0 and report["allreduce"]["busbw_mb_s"] > 0, report
    assert all(n["gpus"] == [] for n in report["nodes"])  # CPU nodes: NVML reports none
    print(f"fabric check {report['seconds']:.1f}s of a {time.monotonic() - t0:.0f}s run: {report['phases_s']}")


def test_a_slow_node_stops_the_job_named(cluster_hosts):
    """With --max-restarts 1 a failed check counts as one failure of the node it names and is run again; the second
    failure of that node ends the run."""
    ns, codes, head = run_three(cluster_hosts, "itfslow", slow="20mbit", options=("--max-restarts", "1"))
    assert codes == [2, 2, 2], head  # the workers exit with the head's code
    first = next((x for x in head.splitlines() if "restart 1/1: fabric check failed" in x), "")
    assert "rank 2 (" in first and ns.ip(2) in first and "below 0.5 x the median" in first, head
    assert ns.ip(1) not in first and first.endswith("; checking again"), first
    error = next((x for x in head.splitlines() if x.startswith("rlrig: error: ")), "")
    assert error.startswith("rlrig: error: rank 2 (") and ns.ip(2) in error, head
    assert "failed twice in this run (failed the fabric check; failed the fabric check)" in error, error
    assert "running: true" not in head, head  # the command never ran
    report = report_of(head)
    assert report["verdict"] == "failed" and [f["rank"] for f in report["failed"]] == [2], report
    # 20 Mbit/s is 2.5 MB/s; the other node got many times that
    assert report["nodes"][2]["to_mb_s"] < 3.5 < 10 * 3.5 < report["nodes"][1]["mb_s"], report


# long: CI runs the check itself (passing and failing) above
@pytest.mark.long
def test_no_fabric_check_skips_it(cluster_hosts):
    _, codes, head = run_three(cluster_hosts, "itfskip", slow="20mbit", options=("--no-fabric-check",))
    assert codes == [0, 0, 0], head
    assert "fabric" not in head and "running: true" in head, head
