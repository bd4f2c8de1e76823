"""Recovery timings, each against a baseline taken in the same run (issue 17's benches).

  restart    two namespace nodes under `rlrig run --max-restarts 1 -- sleep`; the worker's whole node killed
             (SIGKILL to its PID namespace) and started again at once: seconds from the kill to the command
             running again, against the same cluster's first bring-up (start to command running).
  sigterm    `rlrig train` on one node, SIGTERM mid-run: seconds from the signal to the checkpoint written
             and to the exit, against one step plus one periodic checkpoint of the same run.
  fabric     N namespace nodes under `rlrig run -- true`: the seconds the fabric check adds once every node
             joined (its probes start as the nodes join), against the cluster's bring-up, at N = 2, 4, 8.
Needs root (namespaces) and `unshare`. On 2 cores every node shares the same CPUs: the figures are the
machinery's cost here, not a network's.

    python bench/recovery.py                      # all three, fabric at N = 2 4 8 (about 6 minutes here)
    python bench/recovery.py --only fabric --n 2 4
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bringup import BIN, Run, netns, node_env, wait  # the bring-up bench's namespaces and node processes

TRAIN = [
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "trainer.val_before_train=False",
    "trainer.test_freq=0",
    "trainer.save_freq=2",
    "trainer.total_training_steps=60",
]


def kill_node(proc) -> None:
    """SIGKILL to the node's `unshare --kill-child`: its PID namespace, and everything in it, goes at once."""
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait(30)


def restart() -> dict[str, float]:
    run = Run(2, "rlrig")
    for i in range(2):
        (run.tmp / f"n{i}").mkdir()
    args = [
        str(BIN / "rlrig"),
        "run",
        "--max-restarts",
        "1",
        "--rejoin-timeout",
        "120",
        "--no-fabric-check",
        "--",
        "sleep",
        "600",
    ]
    with run.ns:
        try:
            t0 = time.monotonic()
            head, worker = (run.start(i, args, node_env(run.ns, i, 2)) for i in range(2))
            first = wait(lambda: head.saw("running: sleep"), 300, "the first run", run.nodes)
            killed = time.monotonic()
            kill_node(worker)
            run.nodes.remove(worker)  # `wait` fails on any dead node it watches
            run.start(1, args, node_env(run.ns, 1, 2))
            again = wait(
                lambda: sum("running: sleep" in line for line in head.lines) >= 2, 300, "the restart", run.nodes
            )
            noticed = next(line for line in head.lines if "restart 1/1:" in line)
            return {
                "bring-up s": first - t0,
                "kill to running again s": again - killed,
                "ratio restart/bring-up": (again - killed) / (first - t0),
                "cause": noticed,
            }
        finally:
            for proc in run.nodes:
                proc.kill()
            shutil.rmtree(run.tmp, ignore_errors=True)


def sigterm() -> dict[str, float]:
    out = Path(tempfile.mkdtemp(prefix="rbs"))
    marker = out / "latest_checkpointed_iteration.txt"
    cmd = [str(BIN / "rlrig"), "train", "--grace-period", "120", *TRAIN, f"trainer.default_local_dir={out}"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 5):
            if p.poll() is not None:
                raise RuntimeError(f"rlrig train exited {p.returncode} before step 5")
            time.sleep(0.05)
        before = marker.read_text() if marker.exists() else ""
        sent = time.monotonic()
        p.send_signal(signal.SIGTERM)
        while not marker.exists() or marker.read_text() == before:
            if p.poll() is not None and not (marker.exists() and marker.read_text() != before):
                raise RuntimeError(f"exited {p.returncode} without a new checkpoint")
            time.sleep(0.01)
        written = time.monotonic()
        code = p.wait(150)
        exited = time.monotonic()
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        step = statistics.median(r["timing_s/step"] for r in rows if "timing_s/save_checkpoint" not in r)
        save = statistics.median(r["timing_s/save_checkpoint"] for r in rows if "timing_s/save_checkpoint" in r)
        return {
            "exit code": code,
            "one step s": step,
            "one periodic save s": save,
            "signal to checkpoint s": written - sent,
            "signal to exit s": exited - sent,
            "ratio checkpoint/(step+save)": (written - sent) / (step + save),
        }
    finally:
        if p.poll() is None:
            p.kill()
        shutil.rmtree(out, ignore_errors=True)


def fabric(n: int) -> dict[str, float]:
    run = Run(n, "rlrig")
    for i in range(n):
        (run.tmp / f"n{i}").mkdir()
    with run.ns:
        try:
            nodes = [run.start(i, [str(BIN / "rlrig"), "run", "--", "true"], node_env(run.ns, i, n)) for i in range(n)]
            try:
                wait(lambda: nodes[0].saw("fabric check passed"), 600, "the fabric check", run.nodes)
            except RuntimeError as err:
                raise RuntimeError(
                    "the fabric check did not pass; the head's output:\n" + "\n".join(nodes[0].lines[-15:])
                ) from err
            text = "\n".join(nodes[0].lines)
            formed = float(re.search(r"node\(s\) alive after ([\d.]+)s", text).group(1))
            took = float(re.search(r"fabric check passed \(([\d.]+)s after the nodes formed\)", text).group(1))
            report = json.loads(Path(re.search(r"fabric: .*; report (\S+)", text).group(1)).read_text())
            phases = ", ".join(f"{k} {v:.1f}" for k, v in report["phases_s"].items())
            ready = " ".join(f"{n.get('probe_ready_s', '?')}" for n in report["nodes"])
            return {
                "probes ready, s after the last join": ready,
                "bring-up s": formed,
                "fabric check s": took,
                "ratio fabric/bring-up": took / formed,
                "inside the check s": report["seconds"],
                "its phases s": phases,
            }
        finally:
            for proc in run.nodes:
                proc.kill()
            shutil.rmtree(run.tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--only", choices=["restart", "sigterm", "fabric"], nargs="+", default=["restart", "sigterm", "fabric"]
    )
    ap.add_argument("--n", type=int, nargs="+", default=[2, 4, 8], help="node counts for the fabric check")
    args = ap.parse_args(argv)
    why = netns.available()
    if why:
        print(f"bench/recovery.py needs network namespaces: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind the namespaces' `with` blocks
    results = {}
    if "restart" in args.only:
        results["restart (2 nodes)"] = restart()
    if "sigterm" in args.only:
        results["sigterm (1 node)"] = sigterm()
    if "fabric" in args.only:
        for n in args.n:
            results[f"fabric (N={n})"] = fabric(n)
    for name, row in results.items():
        print(name)
        for k, v in row.items():
            print(f"  {k:<32} {v:.2f}" if isinstance(v, float) else f"  {k:<32} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
