"""`rlrig status`: a cluster's nodes, jobs and running trainers' ranks, read through its job API (so it works
wherever `rlrig submit` does: on the head, through a tunnel, or through dstack's forwarded port)."""

from __future__ import annotations

import json
import time

from ..cluster.coordination import HOST_LABEL, RANK_LABEL
from ..console import table
from .api import Job

ENTRYPOINT_WIDTH = 70
# the trainer's watchdog rewrites each training worker's phase every second into its node's Ray log folder
# (trainer/driver/watchdog.py BOARD_PREFIX), which the dashboard's log API serves
BOARD_PREFIX = "rlrig-phases-"
PHASES_GLOB = f"{BOARD_PREFIX}*.json"
STALE_S = 10.0  # a board not rewritten for this long belongs to a trainer that is gone or stuck itself


def driver_nodes(nodes: list[dict]) -> list[str]:
    """The node ids whose log folders may hold a board: the head's (rank 0), where rlrig runs the trainer and
    the job API its jobs' drivers; every alive node where no rank is labelled."""
    alive = [n for n in nodes if n.get("state") == "ALIVE"]
    heads = [n for n in alive if (n.get("labels") or {}).get(RANK_LABEL) == "0"]
    return [n["node_id"] for n in heads or alive]


def training_boards(files: list[dict[str, str]], now: float) -> list[dict]:
    """Each running trainer's ranks ({"job", "age_s", "ranks"}), from the boards' last lines by file name."""
    boards = []
    for found in files:
        for name, line in sorted(found.items()):
            board = json.loads(line)
            job = name.rsplit("/", 1)[-1].removeprefix(BOARD_PREFIX).removesuffix(".json")
            boards.append({"job": job, "age_s": round(now - board["written"], 1), "ranks": board["ranks"]})
    return boards


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


def render_boards(boards: list[dict]) -> list[str]:
    lines = []
    for b in boards:
        stale = b["age_s"] > STALE_S
        lines.append(
            f"training (Ray job {b['job']}): "
            + (f"not updated for {b['age_s']:.0f}s: its trainer is gone or stuck" if stale else "each rank's phase")
        )
        lines += table(
            ["rank", "node", "phase", "step", "seconds in it"],
            [
                [r["label"], r["ip"], r["phase"], str(r["step"]), f"{r['seconds']:.1f}"]
                if r["phase"]
                else [r["label"], r["ip"], "(between steps)", "-", "-"]
                for r in b["ranks"]
            ],
        )
    return lines


def render(nodes: list[dict], jobs: list[dict], url: str, boards: list[dict] | None = None) -> str:
    alive = sum(n["alive"] for n in nodes)
    lines = [f"cluster {url}: {alive} node(s) alive"]
    lines += table(
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

        lines += table(
            ["id", "status", "start", "entrypoint"],
            [[j["id"], j["status"], _when(j["start"]), short(j["entrypoint"])] for j in jobs],
        )
    return "\n".join(lines + render_boards(boards or []))


def as_json(nodes: list[dict], jobs: list[dict], url: str, boards: list[dict] | None = None) -> str:
    return json.dumps({"address": url, "nodes": nodes, "jobs": jobs, "training": boards or []})
