"""What failed where during one `rlrig run|train --max-restarts` run, so a restart never goes back to a node that
failed twice: a node lost while the command ran, a rank the trainer's watchdog found hung there, a node the fabric
check failed. At a node's second failure the run stops, naming it and what it did, and names it in
RLRIG_EXCLUDE_FILE when the launcher set one: the Slurm recipes then relaunch the step without it on a spare node of
the allocation (slurm/rlrig-baremetal.sbatch)."""

from __future__ import annotations

import json
import os

from . import coordination

HANG_REPORT_ENV = "RLRIG_HANG_REPORT"  # where the trainer's watchdog says which node hung (trainer/driver/watchdog.py)
EXCLUDE_FILE_ENV = "RLRIG_EXCLUDE_FILE"  # one node name per line: nodes the launcher must leave out of the next start


class NodeFailures:
    def __init__(self, exclude_file: str = ""):
        self.exclude_file = exclude_file
        self.seen: dict[str, list[str]] = {}

    def add(self, rank: int, nodes: dict[int, dict], what: str) -> str | None:
        """Record that `what` failed on rank `rank`'s node (`nodes`: the nodes' facts by rank, coordination.py); the
        one line that stops the run when it is that node's second failure, else None. A node is its IP: the same
        machine keeps it across restarts in place, whatever rank it rejoins as."""
        facts = nodes.get(rank, {})
        failed = self.seen.setdefault(facts.get("ip") or f"rank {rank}", [])
        failed.append(what)
        if len(failed) < 2:
            return None
        node = coordination.describe(rank, nodes)
        name = facts.get("name") or facts.get("hostname") or "HOST"
        said = f"{node} failed twice in this run ({'; '.join(failed)}): not restarting on it"
        if not self.exclude_file:
            return (
                f"{said}; replace that node or leave it out (Slurm: sbatch --exclude={name}) and run again, which "
                "resumes from the last checkpoint"
            )
        with open(self.exclude_file, "a") as f:
            f.write(name + "\n")
        return f"{said}; named {name} in {self.exclude_file} ({EXCLUDE_FILE_ENV}) for the launcher to leave out"


def hung_rank(report: str, nodes: dict[int, dict]) -> tuple[int, str] | None:
    """(rank, what) from the watchdog's report: the node rank hosting the hung worker (by its IP among the nodes'
    facts) and `rank 1 hung in gen at step 3` (the training rank); None when the trainer wrote none (it exited 5 for
    another reason)."""
    if not os.path.isfile(report):
        return None
    with open(report) as f:
        hang = json.load(f)
    os.unlink(report)  # one report per hang: the next run of the command writes its own
    rank = next((r for r, facts in sorted(nodes.items()) if facts.get("ip") == hang["ip"]), -1)
    return rank, f"{hang['label']} hung in {hang['phase']} at step {hang['step']}"
