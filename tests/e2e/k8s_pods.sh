#!/usr/bin/env bash
# The Kubernetes manifests' pods simulated with podman: for kubernetes/indexed-job.yaml, jobset.yaml, pytorchjob.yaml
# and leaderworkerset.yaml (a standing cluster: a job submitted from the leader, then `rlrig down`), the CPU
# image as one container per pod on one network, each with the host name, DNS name (network alias) and environment
# its pod would get (the manifest's env, the token its Secret holds, what the controller injects: see
# tests/unit/launch_files/test_kubernetes.py), running the manifest's own args made small and CPU-only; they must
# form one cluster and train. Needs root; outside CI (an image build and two short runs). Prints PASS/FAIL.
#   bash tests/e2e/k8s_pods.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/e2e/podman_setup.sh
podman image exists localhost/rlrig:cpu || build_cpu_image
export RLRIG_NOFILE=$hard

stage "Kubernetes pods as podman containers"
.venv/bin/python - <<'PY'
import os
import subprocess
import sys
from pathlib import Path

# a script on stdin: Python searches the current directory (the repository root) first, so `tests` imports
from tests.unit.launch_files.test_kubernetes import REPO, container_env, documents, injected, pod_templates

TOKEN = subprocess.run([".venv/bin/rlrig", "token"], capture_output=True, text=True, check=True).stdout.strip()
SMALL = {"trainer.device": "cpu", "trainer.n_gpus_per_node": "1", "trainer.default_local_dir": "outputs/run"}
EXTRA = ["trainer.total_training_steps=2", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
         "trainer.test_freq=-1", "trainer.save_freq=-1"]
NET = "rlrig-k8s"


def podman(*args, **kw):
    return subprocess.run(["podman", *args], capture_output=True, text=True, **kw)


def pods(doc):
    """(hostname, DNS name, env, args) of each pod the controller would create."""
    templates = pod_templates(doc)
    subdomain = None
    if doc["kind"] == "Job":
        members = [("job", i) for i in range(doc["spec"]["completions"])]
        subdomain = templates["job"]["spec"]["subdomain"]
    elif doc["kind"] == "JobSet":  # its one Indexed Job; JobSet sets the pods' subdomain, the JobSet's name by default
        (rjob,) = doc["spec"]["replicatedJobs"]
        members = [(rjob["name"], i) for i in range(rjob["template"]["spec"]["completions"])]
        subdomain = doc["spec"].get("network", {}).get("subdomain") or doc["metadata"]["name"]
    elif doc["kind"] == "LeaderWorkerSet":
        size = doc["spec"]["leaderWorkerTemplate"]["size"]
        members = [("leader", 0)] + [("worker", i) for i in range(1, size)]
    else:  # PyTorchJob
        members = [(role.lower(), i) for role, r in doc["spec"]["pytorchReplicaSpecs"].items() for i in range(r["replicas"])]
    for role, i in members:
        template = templates[role]
        env, hostname = injected(doc, role, i)
        env = {**container_env(template), **env, "RLRIG_CLUSTER_TOKEN": TOKEN}
        args = [a if a.split("=")[0] not in SMALL else f"{a.split('=')[0]}={SMALL[a.split('=')[0]]}"
                for a in template["spec"]["containers"][0]["args"]]
        args += EXTRA if args[0] == "train" else []
        dns = f"{hostname}.{subdomain}" if subdomain else hostname
        if doc["kind"] == "LeaderWorkerSet" and role == "leader":
            dns = env["LWS_LEADER_ADDRESS"]  # the leader's name through the group's headless Service
        yield hostname, dns, env, args


failed = []
SUBMIT = ["rlrig", "submit", "--", "rlrig", "train", "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
          *EXTRA]
KINDS = {"Job": "indexed-job", "JobSet": "indexed-job", "PyTorchJob": "pytorchjob", "LeaderWorkerSet": "lws"}
for name in ("indexed-job.yaml", "jobset.yaml", "pytorchjob.yaml", "leaderworkerset.yaml"):
    doc = next(d for d in documents(REPO / "kubernetes" / name) if d["kind"] in KINDS)
    # CPU-only pods: no GPUs per node for the operator to announce (PET_NPROC_PER_NODE would be GPUs rlrig expects)
    doc["spec"].pop("nprocPerNode", None)
    podman("network", "rm", "-f", NET)
    podman("network", "create", NET, check=True)
    names = []
    for hostname, dns, env, args in pods(doc):
        cname = f"k8s-{hostname}"
        podman("rm", "-f", cname)
        env_flags = [f for k in env for f in ("-e", k)]
        r = podman("run", "-d", "--name", cname, "--hostname", hostname, "--network", NET, "--network-alias", dns,
                   "--shm-size", "2g", "--ulimit", f"nofile={os.environ['RLRIG_NOFILE']}:{os.environ['RLRIG_NOFILE']}",
                   "--ulimit", "nproc=4096:4096", *env_flags, "localhost/rlrig:cpu", *args, env={**os.environ, **env})
        if r.returncode:
            sys.exit(f"FAIL: podman run {cname}: {r.stderr.strip()}")
        names.append(cname)
    job_log = ""
    if doc["kind"] == "LeaderWorkerSet":  # what a user does through a port-forward, from inside the leader here
        r = podman("exec", names[0], *SUBMIT, timeout=900)
        job_log = r.stdout + r.stderr + f"\nsubmit exited {r.returncode}"
        podman("exec", names[0], "rlrig", "down", timeout=300)
    codes = [podman("wait", c, timeout=900).stdout.strip() for c in names]
    logs = podman("logs", names[0])
    head_log = logs.stdout + logs.stderr + job_log
    launcher = KINDS[doc["kind"]]
    ok = codes == ["0"] * len(names) and "head of 2 node(s)" in head_log and f"({launcher})" in head_log \
        and "done: 2 steps" in head_log and "submit exited 1" not in head_log
    print(f"{name}: pods {', '.join(names)} exited {codes}; "
          + "; ".join(l.strip() for l in head_log.splitlines() if "head of" in l or "workers on" in l or "done:" in l))
    if not ok:
        print(head_log[-3000:])
        failed.append(name)
    for c in names:
        podman("rm", "-f", c)
    podman("network", "rm", "-f", NET)
sys.exit(f"FAIL: {failed}" if failed else 0)
PY
echo "PASS: the Indexed Job's, the JobSet's, the PyTorchJob's and the LeaderWorkerSet's pods, simulated, formed a cluster and trained"
