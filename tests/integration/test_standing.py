"""A standing cluster (`rlrig up` on every namespace host) that jobs are submitted to: the token, Ray's own
job CLI, `rlrig status`/`down`, the ports a stranger can reach, a lost node, SIGTERM, the trainer, debuggers."""

import glob
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.cluster import TOKEN, dstack_env

pytestmark = pytest.mark.integration
JOBS = str(Path(__file__).with_name("standing_jobs.py"))
PROBE = str(Path(__file__).resolve().parents[1] / "helpers" / "portprobe.py")
BIN = Path(sys.executable).parent
URL = "http://127.0.0.1:8265"


def up(cluster_hosts, n: int, run: str, hosts: int | None = None, args=()):
    """`rlrig up` on the first n of `hosts` namespace hosts; returns (namespaces, nodes) once the head is up."""
    ns = cluster_hosts(hosts or n)
    nodes = [
        cluster_hosts.start(ns, i, {**dstack_env(ns, i, run), "DSTACK_NODES_NUM": str(n)}, ["up", *args])
        for i in range(n)
    ]
    nodes[0].wait_for("cluster up:", 180)
    return ns, nodes


def client_env(token: str | None = TOKEN, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLRIG_", "RAY_"))}
    if token:
        env["RLRIG_CLUSTER_TOKEN"] = token
    else:  # a client without a token: not even one a local `ray start` left in this machine's ~/.ray
        env["HOME"] = tempfile.mkdtemp(prefix="rlnohome")
    return {**env, **extra}


def rlrig(ns, i, *args, token=TOKEN, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ns.prefix(i) + [sys.executable, "-m", "rlrig.entrypoint.cli", *args],
        env=client_env(token),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def ray_cli(ns, i, *args, token=TOKEN) -> subprocess.CompletedProcess:
    """Ray's own CLI as its docs say to use it with a token: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN exported."""
    env = client_env(None, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_API_SERVER_ADDRESS=URL)
    return subprocess.run(
        ns.prefix(i) + [str(BIN / "ray"), *args], env=env, capture_output=True, text=True, timeout=120
    )


def tree(node) -> list[psutil.Process]:
    """The node's entrypoint and everything below it (Ray's daemons stay below: rlrig is a subreaper)."""
    root = psutil.Process(node.proc.pid)
    return [root, *root.children(recursive=True)]


def left_running(procs) -> list[str]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(" ".join(p.cmdline())[:120])
        except psutil.NoSuchProcess:
            pass
    return out


def job_status(ns, sid: str) -> str:
    """`ray job status`'s words, lower case (it says `Job 'x' succeeded`)."""
    r = ray_cli(ns, 0, "job", "status", sid)
    return (r.stdout + r.stderr).lower()


def listening(ns, i) -> list[tuple[str, int, str]]:
    """(address, port, process) of every listening TCP socket on host i."""
    out = subprocess.run(ns.prefix(i) + ["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    addrs = []
    for line in out.splitlines():
        host, port = line.split()[3].rsplit(":", 1)
        addrs.append((host.strip("[]").removeprefix("::ffff:"), int(port), line.split()[-1]))
    return addrs


def test_jobs_need_the_token_and_the_cluster_stays_until_down(cluster_hosts):
    ns, nodes = up(cluster_hosts, 2, "st1", hosts=3)  # host 2 is a stranger on the same network
    r = rlrig(ns, 0, "submit", "--", sys.executable, JOBS, "nodes")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"NODES 2 IPS {ns.ip(0)} {ns.ip(1)}" in r.stdout, r.stdout[-2000:]

    # no token, a wrong token, and a bare HTTP call are all refused
    r = rlrig(ns, 0, "submit", "--", "true", token=None)
    assert r.returncode == 2 and "no cluster token" in r.stderr, r.stderr
    r = rlrig(ns, 0, "submit", "--", "true", token="c" * 64)
    assert r.returncode == 2 and "refused the token" in r.stderr, r.stderr
    r = subprocess.run(
        ns.prefix(0) + ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{URL}/api/jobs/"],
        capture_output=True,
        text=True,
    )
    assert r.stdout == "401", r.stdout

    # Ray's own job CLI with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN exported
    r = ray_cli(ns, 0, "job", "submit", "--submission-id", "ray-cli-job", "--", "echo", "from-ray-cli")
    # the job's logs, followed until it succeeded (the CLI exits non-zero otherwise)
    assert r.returncode == 0 and "from-ray-cli" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "ray-cli-job" in ray_cli(ns, 0, "job", "list").stdout
    r = ray_cli(ns, 0, "job", "submit", "--no-wait", "--submission-id", "to-stop", "--", "sleep", "600")
    assert r.returncode == 0, r.stderr
    assert ray_cli(ns, 0, "job", "stop", "to-stop").returncode == 0
    assert "stopped" in job_status(ns, "to-stop")
    r = ray_cli(ns, 0, "job", "list", token="c" * 64)
    assert r.returncode != 0 and "ray-cli-job" not in r.stdout

    r = rlrig(ns, 0, "status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert [(n["rank"], n["ip"], n["alive"]) for n in st["nodes"]] == [(0, ns.ip(0), True), (1, ns.ip(1), True)]
    assert all(n["cpus"] >= 1 and n["host"] for n in st["nodes"])
    assert {j["id"]: j["status"] for j in st["jobs"]}["to-stop"] == "STOPPED"
    assert "rank  host" in rlrig(ns, 0, "status").stdout

    # every port the head listens on beyond loopback refuses a stranger without the token
    outside = [(h, p, who) for h, p, who in listening(ns, 0) if h not in ("127.0.0.1", "::1")]
    assert all(h in (ns.ip(0), "*", "0.0.0.0", "::") for h, _, _ in outside), outside
    ports = sorted({p for _, p, _ in outside})
    assert 6379 in ports and len(ports) >= 5, ports

    def probe(token=None) -> dict:
        args = [sys.executable, PROBE, ns.ip(0), *map(str, ports)] + (["--token", token] if token else [])
        r = subprocess.run(ns.prefix(2) + args, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return {int(k): v for k, v in json.loads(r.stdout).items()}

    stranger = probe()
    open_ports = {p: a for p, a in stranger.items() if a not in ("http 401", "grpc UNAUTHENTICATED", "refused")}
    assert not open_ports, f"answered without the token: {open_ports} (all: {stranger}; listeners: {outside})"
    # the probe can tell: with the token the same ports serve
    member = probe(TOKEN)
    assert not [p for p, a in member.items() if a in ("http 401", "http 403", "grpc UNAUTHENTICATED")], member
    # Ray's three Prometheus endpoints stay on loopback, where they still serve; the head's record names the ports
    # the autoscaler's and the dashboard's took (free ones, not Ray's fixed 44217 and 44227)
    runs = json.loads(rlrig(ns, 0, "status", "--runs", "--json").stdout)["runs"]
    [head] = [r for r in runs if r["host"] == ns.ip(0) and r["rank"] == 0 and r["standing"]]
    metrics = [head["ports"]["autoscaler_metrics"], head["ports"]["dashboard_metrics"]]
    local = {p for h, p, _ in listening(ns, 0) if h == "127.0.0.1"}
    assert set(metrics) <= local, (metrics, local)
    r = subprocess.run(
        ns.prefix(0) + ["curl", "-s", f"http://127.0.0.1:{metrics[1]}/metrics"], capture_output=True, text=True
    )
    assert "# HELP" in r.stdout

    before = [p for n in nodes for p in tree(n)]
    # what the worker prints from here on is its stop's: a `ray start` that rlrig starts again on busy cores prints
    # Ray's own traceback while the node joins, which is not the stop's
    started = len(nodes[1].lines)
    r = rlrig(ns, 2, "down", "--address", f"http://{ns.ip(0)}:8265")  # the dashboard is on loopback: no way in
    assert r.returncode == 2 and "no cluster answers" in r.stderr, r.stderr
    r = rlrig(ns, 0, "down")
    assert r.returncode == 0 and "is down" in r.stderr, r.stderr
    assert [n.wait(60) for n in nodes] == [0, 0], nodes[1].output[-2000:]
    # a normal stop is quiet. A worker's Ray that asked the head's GCS to drain it on SIGTERM raced the GCS's own
    # shutdown: a traceback (RpcError: Cancelling all calls) when it lost, so no drain is asked for at all
    stop = "\n".join(nodes[1].lines[started:])
    assert "Traceback" not in stop and "Draining" not in stop, stop[-3000:]
    time.sleep(1)
    assert not left_running(before)


# long: CI keeps the standing cluster's jobs, token and shutdown, and node loss in test_cluster
@pytest.mark.long
def test_lost_node_fails_the_running_job_and_the_cluster_goes_on(cluster_hosts):
    ns, nodes = up(cluster_hosts, 2, "st3")
    follow = subprocess.Popen(
        ns.prefix(0)
        + [
            sys.executable,
            "-m",
            "rlrig.entrypoint.cli",
            "submit",
            "--submission-id",
            "hangs",
            "--",
            sys.executable,
            JOBS,
            "hang",
        ],
        env=client_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while "running" not in job_status(ns, "hangs") and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(3)  # its actors are placed on both nodes
        worker = tree(nodes[1])
        t0 = time.monotonic()
        ns.cut(1)  # the host dies: off the network, every process gone
        for p in worker:
            p.kill()
        out, err = follow.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        follow.kill()
    assert follow.returncode == 3, err[-2000:]
    assert elapsed < 30, elapsed
    assert "lost node rank 1 (" in err and ns.ip(1) in err, err[-2000:]
    status = job_status(ns, "hangs")
    assert "failed" in status and "lost node rank 1" in status, status
    assert "lost node rank 1 (" in nodes[0].output
    # the cluster keeps serving and takes the node back
    subprocess.run(["ip", "link", "set", f"rlv{ns.tag}1", "up"], check=True)
    back = cluster_hosts.start(ns, 1, dstack_env(ns, 1, "st3"), ["up"])
    nodes[0].wait_for("rejoined", 120)
    r = rlrig(ns, 0, "submit", "--", sys.executable, JOBS, "nodes")
    assert r.returncode == 0 and f"NODES 2 IPS {ns.ip(0)} {ns.ip(1)}" in r.stdout, r.stdout[-2000:]
    # SIGTERM to the head ends every node and leaves nothing running
    before = tree(nodes[0]) + tree(back)
    nodes[0].proc.terminate()
    assert nodes[0].wait(60) == 143
    assert back.wait(60) == 143, back.output[-2000:]
    time.sleep(1)
    assert not left_running(before)


def session_logs(ray_tmp: str) -> str:
    """Every Ray worker's log under the nodes' temp dirs."""
    text = []
    for path in glob.glob(f"{ray_tmp}/**/session_latest/logs/*worker*", recursive=True):
        try:
            text.append(Path(path).read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(text)


# long: CI runs Ray's debugger through the same flag in test_post_mortem_leaves_a_debugger_waiting
@pytest.mark.long
def test_legacy_debugger_lists_the_breakpoint(cluster_hosts):
    ns, nodes = up(cluster_hosts, 1, "st4", args=["--debug", "legacy"])
    assert "RAY_DEBUG=legacy" in nodes[0].output  # printed before Ray starts
    r = rlrig(ns, 0, "submit", "--no-wait", "--", sys.executable, JOBS, "breakpoint")
    assert r.returncode == 0, r.stderr
    env = client_env(None, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
    debug = subprocess.Popen(
        ns.prefix(0) + [str(BIN / "ray"), "debug", "--address", f"{ns.ip(0)}:6379"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(lambda: debug.stdout.read(1), "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while "stop_here" not in "".join(seen) and time.monotonic() < deadline:
            time.sleep(2)
            debug.stdin.write("\n")  # `ray debug` lists breakpoints again on an empty answer
            debug.stdin.flush()
    finally:
        debug.kill()
        debug.wait(10)
    seen = "".join(seen)
    assert "Active breakpoints" in seen and "stop_here" in seen, seen[-2000:]
    nodes[0].proc.terminate()
    assert nodes[0].wait(60) == 143


def test_post_mortem_leaves_a_debugger_waiting(cluster_hosts):
    import debugpy  # noqa: F401 - the `debug` extra; Ray's post-mortem debugger needs it on every node

    ns, nodes = up(cluster_hosts, 1, "st5", args=["--debug", "post-mortem"])
    assert "RAY_DEBUG_POST_MORTEM=1" in nodes[0].output
    r = rlrig(ns, 0, "submit", "--no-wait", "--submission-id", "fails", "--", sys.executable, JOBS, "raise")
    assert r.returncode == 0, r.stderr
    logs = ""
    deadline = time.monotonic() + 120
    while "Waiting for debugger to attach" not in logs and time.monotonic() < deadline:
        time.sleep(1)
        logs = session_logs(cluster_hosts.ray_tmp)
    assert "Waiting for debugger to attach" in logs, logs[-3000:]
    time.sleep(3)
    assert "running" in job_status(ns, "fails")  # the failed task waits for a debugger instead of failing the job
    nodes[0].proc.terminate()
    assert nodes[0].wait(60) == 143
