"""Runs on the head under `rlrig run`: trains (the arguments are the trainer's overrides), then reports through
Ray's state API on which node each of the run's actors lived and what that node offers."""

import subprocess
import sys

import ray
from ray.util.state import list_actors, list_nodes

r = subprocess.run([sys.executable, "-m", "rlrig.trainer.driver.main", *sys.argv[1:]])
if r.returncode:
    sys.exit(r.returncode)
ray.init()
nodes = {n.node_id: n for n in list_nodes(detail=True)}
for a in list_actors(detail=True, limit=1000):  # the run's actors are dead by now; Ray keeps their records
    if a.class_name not in ("TrainingWorker", "RefWorker", "RewardModelWorker"):
        continue
    n = nodes[a.node_id]
    custom = sorted(
        k
        for k in n.resources_total
        if k not in ("CPU", "GPU", "memory", "object_store_memory") and not k.startswith("node:")
    )
    print("ACTOR", a.class_name, n.node_ip, ",".join(custom) or "-", flush=True)
