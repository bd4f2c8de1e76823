"""`rlrig status`: a standing cluster's nodes and jobs, read through its job API (so it works wherever
`rlrig submit` does: on the head, through a tunnel, or through dstack's forwarded port)."""

from __future__ import annotations

import json
import time

from .coordination import HOST_LABEL, RANK_LABEL
from .jobs import Job

ENTRYPOINT_WIDTH = 70


def node_rows(nodes: list[dict]) -> list[dict]:
    """One row per Ray node, rlrig's ranks first; a node that died and rejoined shows both records."""
    rows = []
    for n in nodes:
        labels = n.get("labels") or {}
        res = n.get("resources_total") or {}
        rows.append(
            {
                "rank": int(labels[RANK_LABEL]) if RANK_LABEL in labels else None,
                "host": labels.get(HOST_LABEL) or n.get("node_name") or "",
                "ip": n.get("node_ip", ""),
                "gpus": int(res.get("GPU", 0)),
                "cpus": int(res.get("CPU", 0)),
                "alive": n.get("state") == "ALIVE",
            }
        )
    return sorted(rows, key=lambda r: (r["rank"] is None, r["rank"] or 0, not r["alive"], r["ip"]))


def job_rows(jobs: list[Job]) -> list[dict]:
    rows = [
        {"id": j.submission_id, "status": j.status, "start": j.start_time, "entrypoint": j.entrypoint} for j in jobs
    ]
    return sorted(rows, key=lambda r: r["start"] or 0)


def _when(ms: int | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def render(nodes: list[dict], jobs: list[dict], url: str) -> str:
    alive = sum(n["alive"] for n in nodes)
    lines = [f"cluster {url}: {alive} node(s) alive"]
    lines += _table(
        ["rank", "host", "ip", "gpus", "cpus", "alive"],
        [
            [
                "-" if n["rank"] is None else str(n["rank"]),
                n["host"],
                n["ip"],
                str(n["gpus"]),
                str(n["cpus"]),
                "yes" if n["alive"] else "no",
            ]
            for n in nodes
        ],
    )
    lines.append(f"jobs: {len(jobs)}")
    if jobs:

        def short(text: str) -> str:
            return text if len(text) <= ENTRYPOINT_WIDTH else text[: ENTRYPOINT_WIDTH - 3] + "..."

        lines += _table(
            ["id", "status", "start", "entrypoint"],
            [[j["id"], j["status"], _when(j["start"]), short(j["entrypoint"])] for j in jobs],
        )
    return "\n".join(lines)


def as_json(nodes: list[dict], jobs: list[dict], url: str) -> str:
    return json.dumps({"address": url, "nodes": nodes, "jobs": jobs})
