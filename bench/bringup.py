"""Cluster bring-up time: rlrig vs `ray symmetric-run` vs the seed scripts' sleeps vs bare `ray start`.

Measures, for N node entrypoints started at once on N network-namespace hosts, the seconds until
all N nodes are alive and the command has started on the head. Needs root (namespaces). Each node
also gets its own PID namespace, as real hosts have: symmetric-run's "is Ray already running here"
scan and its closing `ray stop` would otherwise see and kill the other "nodes".

Methods:
  rlrig      `rlrig run --no-fabric-check -- CMD` on every node (dstack variables), token auth on: formation alone.
  rlrig+fabric  `rlrig run -- CMD` as users run it: the fabric check between the nodes before the command.
  symmetric  `ray symmetric-run --address HEAD:6379 --min-nodes N -- CMD` on every node.
  sleeps     the seed scripts: head; sleep 10; each worker then sleep 5; then CMD.
  floor      bare `ray start`: head, and the instant it is up, all workers at once; CMD the instant
             the last one is up (an orchestrator with perfect knowledge and no polling).
All use the same token (`RAY_AUTH_MODE=token`) and one CPU per node.

    python bench/bringup.py                 # N = 2 4 8, 3 runs each (about 45 minutes on 2 cores)
    python bench/bringup.py --n 2 --runs 1  # quick look
    python bench/bringup.py --n 4 8 --methods floor rlrig rlrig+fabric symmetric   # the fabric check's cost
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench scripts run as files: repo root, for tests
from tests.helpers import netns  # noqa: E402
from tests.helpers.nodeproc import NodeProc  # noqa: E402

TOKEN = "b" * 64
PORT = 6379
STARTED = "Ray runtime started"
BIN = Path(sys.executable).parent


def node_env(ns, i: int, n: int) -> dict[str, str]:
    """What dstack would set on node i of n (rlrig reads it as a user's run would), one CPU each."""
    return {
        "DSTACK_NODE_RANK": str(i),
        "DSTACK_NODES_NUM": str(n),
        "DSTACK_MASTER_NODE_IP": ns.ip(0),
        "DSTACK_RUN_NAME": "bench",
        "RLRIG_NUM_CPUS": "1",
    }


class SleepsTooShort(RuntimeError):
    """The fixed sleeps ran out before the nodes were up: the failure the seed scripts are known for."""


def node(ns: netns.Netns, i: int, cmd: list[str], env: dict[str, str]) -> NodeProc:
    """One process tree in its own network and PID namespace; ending it ends the whole namespace."""
    return NodeProc(ns.prefix(i) + ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL", *cmd], env)


def wait(pred, timeout: float, what: str, nodes: list[NodeProc]) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        dead = [i for i, node in enumerate(nodes) if node.proc.poll() is not None]
        if dead:
            break
        time.sleep(0.01)
    else:
        dead = [0]
    tail = "\n".join(nodes[dead[0]].lines[-30:])
    raise RuntimeError(f"{what} did not happen (node {dead[0]} exited or {timeout}s passed); its output:\n{tail}")


METHODS = ["floor", "rlrig", "rlrig+fabric", "symmetric", "sleeps"]


class Run:
    """One bring-up of one method on fresh namespaces; returns seconds from start to CMD started."""

    def __init__(self, n: int, method: str):
        self.n, self.method = n, method
        self.ns = netns.Netns(n, subnet=240)
        # short: Ray's socket paths below each node's temp dir must stay under 107 bytes
        self.tmp = Path(tempfile.mkdtemp(prefix="rb", dir="/tmp"))
        self.marker = self.tmp / "cmd_started"
        self.cmd = ["sh", "-c", f"date +%s.%N > {self.marker}"]
        self.nodes: list[NodeProc] = []
        self.note = ""  # rlrig+fabric: the head's line with the check's own time

    def env(self, i: int) -> dict[str, str]:
        env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": TOKEN,
            "RLRIG_CLUSTER_TOKEN": TOKEN,
            "RAY_TMPDIR": str(self.tmp / f"n{i}"),
            "PATH": f"{BIN}:{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        env.pop("RAY_ADDRESS", None)
        return env

    def start(self, i: int, cmd: list[str], extra: dict[str, str] | None = None) -> NodeProc:
        proc = node(self.ns, i, cmd, {**self.env(i), **(extra or {})})
        self.nodes.append(proc)
        return proc

    def ray_start(self, i: int) -> NodeProc:
        ip = self.ns.ip(i)
        # each node its own --temp-dir, as on separate hosts: a worker otherwise takes the head's (shared here)
        common = [
            "--block",
            "--num-cpus=1",
            "--num-gpus=0",
            f"--node-ip-address={ip}",
            "--disable-usage-stats",
            f"--temp-dir={self.tmp / f'n{i}' / 'ray'}",
        ]
        if i == 0:
            return self.start(i, ["ray", "start", "--head", f"--port={PORT}", "--dashboard-host=127.0.0.1", *common])
        return self.start(i, ["ray", "start", f"--address={self.ns.ip(0)}:{PORT}", *common])

    def measure(self) -> float:
        for i in range(self.n):
            (self.tmp / f"n{i}").mkdir()
        with self.ns:
            try:
                t0 = time.monotonic()
                wall0 = time.time()
                getattr(self, self.method.replace("+", "_"))()
                if self.method in ("rlrig", "rlrig+fabric", "symmetric"):
                    wait(self.marker.exists, 300, "the command", self.nodes)
                    time.sleep(0.05)  # let `date` finish writing
                    self.note = next((x for x in self.nodes[0].lines if "fabric check passed" in x), "")
                    self.note += phases(self.nodes[0].lines)
                    return float(self.marker.read_text()) - wall0
                return time.monotonic() - t0
            finally:
                for proc in self.nodes:
                    proc.kill()
                shutil.rmtree(self.tmp, ignore_errors=True)

    def rlrig(self, fabric: bool = False):
        check = [] if fabric else ["--no-fabric-check"]  # formation alone, as the others measure
        for i in range(self.n):
            self.start(i, [str(BIN / "rlrig"), "run", *check, "--", *self.cmd], node_env(self.ns, i, self.n))

    def rlrig_fabric(self):
        self.rlrig(fabric=True)

    def symmetric(self):
        # its default 30 s wait for nodes is too short for 8 Ray nodes on 2 cores; a user would raise it too
        slow_ok = {"RAY_SYMMETRIC_RUN_CLUSTER_WAIT_TIMEOUT": "300"}
        for i in range(self.n):
            self.start(
                i,
                [
                    "ray",
                    "symmetric-run",
                    "--address",
                    f"{self.ns.ip(0)}:{PORT}",
                    "--min-nodes",
                    str(self.n),
                    "--num-cpus=1",
                    "--num-gpus=0",
                    "--disable-usage-stats",
                    f"--temp-dir={self.tmp / f'n{i}' / 'ray'}",
                    "--",
                    *self.cmd,
                ],
                slow_ok,
            )

    def sleeps(self):
        self.ray_start(0)
        time.sleep(10)
        for i in range(1, self.n):
            self.ray_start(i)
            time.sleep(5)
        # the scripts start the command blind: check afterwards that the nodes had really joined
        started = [proc for proc in self.nodes if proc.saw(STARTED)]
        if len(started) != self.n:
            raise SleepsTooShort(f"sleeps: only {len(started)}/{self.n} nodes were up when the command started")

    def floor(self):
        head = self.ray_start(0)
        wait(lambda: head.saw(STARTED), 120, "head", self.nodes)
        workers = [self.ray_start(i) for i in range(1, self.n)]
        wait(lambda: all(w.saw(STARTED) for w in workers), 120, "workers", self.nodes)


def phases(lines: list[str]) -> str:
    """The check's own phases from its report (the head's `fabric: ... report PATH` line), read before the run's
    temp dir goes: where its seconds went, beside the head's line."""
    import json

    said = [x for x in lines if x.startswith("rlrig: fabric:") and "report /" in x]
    path = said[0].rsplit("report ", 1)[1].strip() if said else ""
    try:
        report = json.loads(Path(path).read_text()) if path else {}
    except (OSError, ValueError):
        return ""
    laps = report.get("phases_s") or {}
    return ("; " + ", ".join(f"{k} {v:.2f}s" for k, v in laps.items())) if laps else ""


RATIOS = [
    ("rlrig", "floor"),
    ("rlrig", "symmetric"),
    ("rlrig+fabric", "floor"),
    ("rlrig+fabric", "symmetric"),
    ("rlrig+fabric", "rlrig"),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=[*METHODS, "rlrig+fabric"])
    args = ap.parse_args(argv)
    why = netns.available()
    if why:
        print(f"bench/bringup.py needs network namespaces: {why}", file=sys.stderr)
        return 2
    if not shutil.which("unshare"):
        print("bench/bringup.py needs `unshare` (util-linux)", file=sys.stderr)
        return 2
    # a killed bench must still remove its namespaces (the `with` blocks): SIGTERM unwinds like Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    times: dict[tuple[int, str], list[float]] = {(n, m): [] for n in args.n for m in args.methods}
    for n in args.n:
        # the methods take turns within each round: drift in the machine's load then falls on all of them alike
        for r in range(args.runs):
            for method in args.methods:
                run = Run(n, method)
                try:
                    times[n, method].append(run.measure())
                except SleepsTooShort as e:
                    times[n, method].append(float("inf"))  # counts as a failed bring-up, not as a time
                    print(f"  N={n} {method:<12} run {r + 1}: failed ({e})", file=sys.stderr, flush=True)
                    continue
                note = f"  ({run.note.removeprefix('rlrig: ')})" if run.note else ""
                took = times[n, method][-1]
                print(f"  N={n} {method:<12} run {r + 1}: {took:6.2f} s{note}", file=sys.stderr, flush=True)
    table = {key: statistics.median(values) for key, values in times.items()}
    print(f"\nmedian seconds from start to 'all N alive and command started' ({args.runs} runs each)")
    ratios = [(a, b) for a, b in RATIOS if {a, b} <= set(args.methods)]
    labels = [f"{a}/{b}" for a, b in ratios]
    print(f"{'N':>3} " + " ".join(f"{m:>12}" for m in args.methods) + "".join(f"  {x}" for x in labels))
    for n in args.n:
        row = " ".join(f"{table[n, m]:12.2f}" for m in args.methods)
        cells = "".join(f"  {table[n, a] / table[n, b]:>{len(x)}.2f}" for (a, b), x in zip(ratios, labels))
        print(f"{n:>3} {row}{cells}")
    # the last line: each ratio at every N, the figures the README and docs/benchmarks.md quote
    if ratios:
        print(
            "; ".join(
                f"{x} " + ", ".join(f"N={n} {table[n, a] / table[n, b]:.2f}x" for n in args.n)
                for (a, b), x in zip(ratios, labels)
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
