"""What failed where, so that nothing goes back to a node that failed twice: a node lost, a rank a trainer's
watchdog found hung there, a node the fabric check failed. In a `rlrig run|train --max-restarts` run, the node's
second failure stops the run, naming it and what it did, and names it in RLRIG_EXCLUDE_FILE when the launcher set
one: the Slurm recipes then relaunch the step without it on a spare node of the allocation
(slurm/rlrig-baremetal.sbatch). A standing cluster drains it instead (jobs/standing.py)."""

from __future__ import annotations

from . import coordination

HANG_KEY_PREFIX = "hang/"  # the trainer's watchdog puts each hang here, by Ray job (trainer/driver/watchdog.py)
EXCLUDE_FILE_ENV = "RLRIG_EXCLUDE_FILE"  # one node name per line: nodes the launcher must leave out of the next start


class NodeFailures:
    def __init__(self, exclude_file: str = ""):
        self.exclude_file = exclude_file
        self.seen: dict[str, list[str]] = {}
        self.hangs_read: set[str] = set()

    def count(self, rank: int, nodes: dict[int, dict], what: str) -> str | None:
        """Record that `what` failed on rank `rank`'s node (`nodes`: the nodes' facts by rank, coordination.py);
        `rank 1 (node2, 10.0.0.2) failed twice (a; b)` when it is that node's second failure, else None. A node is
        its IP: the same machine keeps it across restarts in place, whatever rank it rejoins as."""
        failed = self.seen.setdefault(nodes.get(rank, {}).get("ip") or f"rank {rank}", [])
        failed.append(what)
        if len(failed) != 2:
            return None
        return f"{coordination.describe(rank, nodes)} failed twice ({'; '.join(failed)})"

    def add(self, rank: int, nodes: dict[int, dict], what: str) -> str | None:
        """count(), for a run: the one line that stops it at a node's second failure, naming the node in the
        exclude file where there is one, else None."""
        twice = self.count(rank, nodes, what)
        if twice is None:
            return None
        facts = nodes.get(rank, {})
        name = facts.get("name") or facts.get("hostname") or "HOST"
        said = twice.replace(" failed twice (", " failed twice in this run (", 1) + ": not restarting on it"
        if not self.exclude_file:
            return (
                f"{said}; replace that node or leave it out (Slurm: sbatch --exclude={name}) and run again, which "
                "resumes from the last checkpoint"
            )
        with open(self.exclude_file, "a") as f:
            f.write(name + "\n")
        return f"{said}; named {name} in {self.exclude_file} ({EXCLUDE_FILE_ENV}) for the launcher to leave out"

    def hangs(self, store: coordination.Store, nodes: dict[int, dict]) -> list[tuple[int, str]]:
        """(rank, what) for each hang the trainers' watchdogs reported since the last look: the node rank hosting the
        hung worker (by its IP) and `rank 1 hung in gen at step 3` (the training rank)."""
        found = []
        for key in sorted(set(store.keys(HANG_KEY_PREFIX)) - self.hangs_read):
            self.hangs_read.add(key)
            hang = store.get(key)
            if hang is not None:
                rank = next((r for r, facts in sorted(nodes.items()) if facts.get("ip") == hang["ip"]), -1)
                found.append((rank, f"{hang['label']} hung in {hang['phase']} at step {hang['step']}"))
        return found
