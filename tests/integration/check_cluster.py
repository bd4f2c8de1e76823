"""Runs on the head under `rlrig run`: prints facts the integration test asserts on."""

import os
import subprocess
import sys

import ray

ray.init()
alive = [n for n in ray.nodes() if n["Alive"]]
print("NODES", len(alive), flush=True)


@ray.remote(num_cpus=0)
def probe():
    return os.environ.get("FROM_HEAD_ENV"), os.environ.get("GLOO_SOCKET_IFNAME"), ray.util.get_node_ip_address()


refs = [
    probe.options(
        scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
    ).remote()
    for n in alive
]
for env_value, gloo, ip in sorted(ray.get(refs), key=lambda t: t[2]):
    print("WORKER", ip, env_value, gloo, flush=True)

# A driver without the cluster token must be refused.
env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RLRIG_CLUSTER_TOKEN")}
env["RAY_AUTH_TOKEN"] = "b" * 64
# Ray's own bound on a driver's tries to reach the GCS (20 of about 1 s each): the GCS is up and answering by now
env["RAY_gcs_server_port_wait_time_s"] = "3"
r = subprocess.run(
    [sys.executable, "-c", "import ray; ray.init(); print('CONNECTED')"],
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
)
print("NO_TOKEN_DRIVER", "connected" if "CONNECTED" in r.stdout else "refused", flush=True)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
