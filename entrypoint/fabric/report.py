"""The fabric check's report: built from the verdict and the figures, said as one line per node, written as JSON
to the head's temp dir, and read back by the head (failure_message, failed_ranks) and by `rlrig doctor` (brief).

The check's exit code: 0 passed (or nothing to check), FAILED (2) a node failed, anything else: the check itself
broke.
"""

from __future__ import annotations

import json
import os

from ..console import say
from .protocol import PAIR_BYTES
from .verdict import judge, name

REPORT_NAME = "fabric.json"  # in the head's temp dir
FAILED = 2


def report_of(nodes: list[dict], allreduce: dict, backend: str, phases: dict, min_ratio: float) -> dict:
    """The verdict on the measured nodes and the all-reduce, with everything measured: the report (less `seconds`)."""
    verdict = judge(nodes, min_ratio)
    if allreduce.get("error"):
        verdict.update(ok=False, message=f"the all-reduce over every node failed: {allreduce['error']}")
    return {
        **verdict,
        "verdict": "passed" if verdict["ok"] else "failed",
        "backend": backend,
        "pair_bytes": PAIR_BYTES,
        "allreduce": allreduce,
        "nodes": nodes,
        "phases_s": phases,
    }


def node_line(n: dict) -> str:
    """One line per node: rank, host, IP, MB/s, ms (and its GPUs)."""
    if n.get("error"):
        net = f"FAILED: {n['error']}"
    elif n["rank"] == 0:
        net = "head (the other end of every pair)"
    elif n.get("mb_s") is None:
        net = "not measured (the check stopped at another node)"
    else:
        net = (
            f"{n['mb_s']:.1f} MB/s (from the head {n['to_mb_s']:.1f}, to it {n['from_mb_s']:.1f}), "
            f"round trip {n['rtt_ms']:.2f} ms"
        )
    gpus = n.get("gpus") or []
    return f"{name(n)}: {net}; GPUs: {len(gpus) if gpus else 'none'}"


def summary(report: dict) -> str:
    ar = report.get("allreduce") or {}
    ar_text = (
        f"all-reduce {ar['bytes'] >> 20} MiB: {ar['seconds'] * 1e3:.1f} ms (bus {ar['busbw_mb_s']:.0f} MB/s)"
        if "seconds" in ar
        else f"all-reduce {ar.get('skipped') or ar.get('error') or 'not run'}"
    )
    med = report.get("median_mb_s")
    return (
        f"{report['verdict']} in {report['seconds']:.1f}s over {len(report['nodes'])} nodes ({report['backend']}): "
        f"median {med:.1f} MB/s, {ar_text}"
        if med is not None
        else f"{report['verdict']} in {report['seconds']:.1f}s over {len(report['nodes'])} nodes ({report['backend']})"
    )


def brief(report: dict) -> dict:
    """What `rlrig doctor` shows of a report: the verdict and where the check's seconds went."""
    return {k: report.get(k) for k in ("verdict", "seconds", "phases_s", "backend", "median_mb_s")}


def publish(report: dict, path: str) -> int:
    """Say the report's lines, write it to `path`; the check's exit code (0 passed, FAILED)."""
    for n in report["nodes"]:
        say(f"fabric: {node_line(n)}")
    for w in report["warnings"]:
        say(f"fabric: warning: {w}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    say(f"fabric: {summary(report)}; report {path}")  # on failure the head says why, in one line
    return 0 if report["ok"] else FAILED


def _read(report_path: str) -> dict:
    try:
        with open(report_path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}  # the check died before writing it: the caller says so


def failure_message(report_path: str, code: int) -> str:
    """The head's one-line error for a check that exited `code` (not 0), from the report when there is one."""
    report = _read(report_path)
    skip = "rerun with --no-fabric-check to skip it"
    if code == FAILED and report.get("message"):
        return f"fabric check failed: {report['message']}; report {report_path}; {skip}"
    return f"fabric check could not run (exit {code}); see its output above; {skip}"


def failed_ranks(report_path: str) -> list[int]:
    """The node ranks a failed check named (none where it could not run): each a failure of that node."""
    return [f["rank"] for f in _read(report_path).get("failed", [])]
