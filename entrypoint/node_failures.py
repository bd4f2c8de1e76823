"""What failed where during one `rlrig run|train --max-restarts` run, so a restart never goes back to a node that
failed twice: a node lost while the command ran, a rank the trainer's watchdog found hung there. Without a node to
put in its place the run stops, naming it and what it did."""

from __future__ import annotations

import json
import os

HANG_REPORT_ENV = "RLRIG_HANG_REPORT"  # where the trainer's watchdog says which node hung (trainer/driver/watchdog.py)


class NodeFailures:
    def __init__(self):
        self.seen: dict[str, list[str]] = {}

    def add(self, node: str, what: str) -> str | None:
        """Record `what` failed on `node` (`rank 1 (10.0.0.2)`); the one line that stops the run when it is that
        node's second failure, else None."""
        self.seen.setdefault(node, []).append(what)
        if len(self.seen[node]) < 2:
            return None
        return (
            f"{node} failed twice in this run ({'; '.join(self.seen[node])}): not restarting on it; replace that "
            "node or leave it out (Slurm: sbatch --exclude=HOST) and run again, which resumes from the last checkpoint"
        )


def hung_node(report: str, nodes: dict[int, dict]) -> tuple[str, str] | None:
    """(node, what) from the watchdog's report: `rank 1 (10.0.0.2)` by the hung worker's IP among the nodes' facts,
    and `a hang in gen at step 3`; None when the trainer wrote none (it exited 5 for another reason)."""
    if not os.path.isfile(report):
        return None
    with open(report) as f:
        hang = json.load(f)
    os.unlink(report)  # one report per hang: the next run of the command writes its own
    rank = next((r for r, facts in sorted(nodes.items()) if facts.get("ip") == hang["ip"]), "?")
    return f"rank {rank} ({hang['ip']})", f"{hang['label']} hung in {hang['phase']} at step {hang['step']}"
