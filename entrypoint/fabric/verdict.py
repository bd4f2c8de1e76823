"""The fabric check's verdict on measured figures: pure (no network, no Ray), so that tests can feed it figures.

A node fails on its own error (its pair or its probe broke), on bandwidth below min_ratio x the median of the nodes
measured, or on a GPU reading that gpu_health fails; a GPU reading it only warns on is a warning. Every pair has
rank 0 at one end: a slow head slows all pairs alike and stands out from no median; with one worker there is no
median to compare with, only failures count.
"""

from __future__ import annotations

import statistics

from ..cluster.coordination import describe
from ..preflight import gpu_health


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def name(node: dict) -> str:
    """`rank 2 (host, 10.0.0.3)`, as the rest of rlrig names nodes."""
    return describe(node["rank"], {node["rank"]: {"hostname": node.get("host", "")}}, node.get("ip", ""))


def measured_median(nodes: list[dict]) -> float | None:
    """The median bandwidth of the nodes measured without an error (None: none was)."""
    return median([n["mb_s"] for n in nodes if n.get("mb_s") is not None and not n.get("error")])


def below_bar(nodes: list[dict], min_ratio: float) -> list[dict]:
    """The nodes measured below min_ratio x the median: the ones judge fails on bandwidth."""
    med = measured_median(nodes)
    return [
        n for n in nodes if not n.get("error") and n.get("mb_s") is not None and med and n["mb_s"] < min_ratio * med
    ]


def judge(nodes: list[dict], min_ratio: float) -> dict:
    """The verdict on the per-node figures: {ok, median_mb_s, failed: [{rank, host, ip, reasons}], warnings, message}.

    A node's figures: rank, host, ip, mb_s (None for the head, which is every pair's other end), error (its pair or
    its probe failed), gpus (gpu_health readings)."""
    med, slow = measured_median(nodes), {n["rank"] for n in below_bar(nodes, min_ratio)}
    failed, warnings = [], []
    for n in sorted(nodes, key=lambda n: n["rank"]):
        reasons = []
        if n.get("error"):
            reasons.append(n["error"])
        elif n["rank"] in slow:
            reasons.append(f"{n['mb_s']:.1f} MB/s, below {min_ratio:g} x the median {med:.1f} MB/s")
        for gpu in n.get("gpus") or []:
            fails, warns = gpu_health.problems(gpu)
            reasons += fails
            warnings += [f"{name(n)}: {w}" for w in warns]
        if reasons:
            failed.append({"rank": n["rank"], "host": n.get("host", ""), "ip": n.get("ip", ""), "reasons": reasons})
    message = "; ".join(f"{name(f)}: {', '.join(f['reasons'])}" for f in failed)
    return {
        "ok": not failed,
        "median_mb_s": med,
        "min_ratio": min_ratio,
        "failed": failed,
        "warnings": warnings,
        "message": message,
    }
