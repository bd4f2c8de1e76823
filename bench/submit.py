"""A standing cluster's first job: rlrig vs the seed scripts' sleeps vs a floor.

Measures, for N node entrypoints started at once on N network-namespace hosts (each also in its own PID
namespace, as bench/bringup.py builds them), the seconds until the first submitted job is running, and
how many nodes that job saw (a job that starts before every node joined trains on fewer). Needs root.

Methods:
  rlrig   `rlrig up` on every node, and at the same moment `rlrig submit --no-wait -- JOB` on the head,
          which waits for the job API and for all N nodes itself.
  seeds   OpenRLHF's Slurm script: `ray start --head`, sleep 10, each worker then sleep 1, sleep 30, then
          `ray job submit --no-wait -- JOB` (verl's guide leaves the waiting to the reader).
  floor   bare `ray start`: the head, the instant it is up all workers at once, the instant the last is up
          the submission (`rlrig submit`, which submits the moment the job API answers).
All use the same token (RAY_AUTH_MODE=token) and one CPU per node; JOB is a Python one-liner that records
when it started and how many nodes it sees.

    python bench/submit.py                 # N = 2 4, 3 runs each (about 15 minutes on 2 cores)
    python bench/submit.py --n 2 --runs 1  # quick look
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import sys
import time

import bringup
from bringup import BIN, STARTED, netns, node_env, wait

SUBNET = 241


class SubmitRun(bringup.Run):
    def __init__(self, n: int, method: str):
        super().__init__(n, method)
        self.ns = netns.Netns(n, subnet=SUBNET)
        self.marker = self.tmp / "job_started"
        code = (
            f"import time; t = time.time(); import ray; ray.init(); "
            f"n = len([x for x in ray.nodes() if x['Alive']]); open('{self.marker}', 'w').write(f'{{t}} {{n}}')"
        )
        self.job = ["python3", "-c", code]
        self.clients: list[bringup.NodeProc] = []

    def client(self, cmd: list[str]) -> None:
        """A short-lived command on the head host: not a node, its exit does not end the run."""
        self.clients.append(bringup.NodeProc(self.ns.prefix(0) + cmd, self.env(0)))

    def measure(self) -> tuple[float, int]:
        for i in range(self.n):
            (self.tmp / f"n{i}").mkdir()
        with self.ns:
            try:
                wall0 = time.time()
                getattr(self, self.method)()
                wait(
                    lambda: self.marker.exists() and self.marker.read_text().count(" ") == 1, 300, "the job", self.nodes
                )
                started, seen = self.marker.read_text().split()
                return float(started) - wall0, int(seen)
            finally:
                for proc in self.nodes + self.clients:
                    proc.kill()
                shutil.rmtree(self.tmp, ignore_errors=True)

    def rlrig(self):
        for i in range(self.n):
            self.start(i, [str(BIN / "rlrig"), "up"], node_env(self.ns, i, self.n))
        self.client([str(BIN / "rlrig"), "submit", "--no-wait", "--", *self.job])

    def seeds(self):
        self.ray_start(0)
        time.sleep(10)
        for i in range(1, self.n):
            self.ray_start(i)
            time.sleep(1)
        time.sleep(30)
        self.client(
            [str(BIN / "ray"), "job", "submit", "--address", "http://127.0.0.1:8265", "--no-wait", "--", *self.job]
        )

    def floor(self):
        head = self.ray_start(0)
        wait(lambda: head.saw(STARTED), 120, "head", self.nodes)
        workers = [self.ray_start(i) for i in range(1, self.n)]
        wait(lambda: all(w.saw(STARTED) for w in workers), 120, "workers", self.nodes)
        self.client([str(BIN / "rlrig"), "submit", "--no-wait", "--", *self.job])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["floor", "rlrig", "seeds"])
    args = ap.parse_args(argv)
    why = netns.available()
    if why or not shutil.which("unshare"):
        print(
            f"bench/submit.py needs network namespaces and unshare: {why or 'no unshare (util-linux)'}", file=sys.stderr
        )
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind the `with` blocks: namespaces are removed
    table: dict[tuple[int, str], float] = {}
    short: dict[tuple[int, str], int] = {}
    for n in args.n:
        for method in args.methods:
            times = []
            for r in range(args.runs):
                seconds, seen = SubmitRun(n, method).measure()
                if seen < n:
                    short[n, method] = short.get((n, method), 0) + 1
                    times.append(float("inf"))  # the job started on part of the cluster: a failed bring-up
                    print(
                        f"  N={n} {method:<6} run {r + 1}: {seconds:6.2f} s, but the job saw {seen}/{n} nodes",
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                times.append(seconds)
                print(f"  N={n} {method:<6} run {r + 1}: {seconds:6.2f} s", file=sys.stderr, flush=True)
            table[n, method] = statistics.median(times)
    print(
        f"\nmedian seconds from starting the nodes to the first submitted job running, with every node "
        f"({args.runs} runs each; inf: the job saw fewer nodes)"
    )
    print(f"{'N':>3} " + " ".join(f"{m:>8}" for m in args.methods) + "  rlrig/floor  rlrig/seeds")
    for n in args.n:
        row = " ".join(f"{table[n, m]:8.2f}" for m in args.methods)
        ratio = lambda other, n=n: (
            table[n, "rlrig"] / table[n, other] if other in args.methods and "rlrig" in args.methods else float("nan")
        )
        print(f"{n:>3} {row}  {ratio('floor'):11.2f}  {ratio('seeds'):11.2f}")
    if short:
        print(
            "runs whose job saw fewer than N nodes: "
            + ", ".join(f"N={n} {m}: {k}" for (n, m), k in sorted(short.items()))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
