"""Jobs the standing-cluster tests submit: python standing_jobs.py nodes|hang|breakpoint|raise."""

import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init()
alive = [n for n in ray.nodes() if n["Alive"]]
mode = sys.argv[1]


@ray.remote(num_cpus=0)
class Rank:
    def ip(self):
        return ray.util.get_node_ip_address()


@ray.remote(num_cpus=0)
def stop_here():
    breakpoint()  # noqa: T100 - the test lists it with `ray debug`
    return 1


@ray.remote(num_cpus=0, max_retries=0)
def fail():
    raise ValueError("a failing task, for the post-mortem debugger")


if mode in ("nodes", "hang"):
    # one actor pinned to each node: what a training job's collective looks like to Ray
    ranks = [
        Rank.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in alive
    ]
    print("NODES", len(alive), "IPS", " ".join(sorted(ray.get([r.ip.remote() for r in ranks]))), flush=True)
    if mode == "hang":
        time.sleep(600)  # as a collective waits for a rank that is gone
elif mode == "breakpoint":
    ref = stop_here.remote()
    print("WAITING AT A BREAKPOINT", flush=True)
    ray.get(ref)
elif mode == "raise":
    ref = fail.remote()
    print("A TASK FAILS", flush=True)
    ray.get(ref)
