#!/usr/bin/env bash
# slurm/rlrig-podman.sbatch for real: the CPU image (built here if missing) run by podman on both nodes of the
# two-node Slurm the integration tests use (one slurmd per network namespace), training 2 steps across them.
# Needs root; outside CI (an image build and a Slurm job, about 10 minutes). Prints PASS/FAIL.
#   bash tests/e2e/slurm_podman.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/e2e/podman_setup.sh
podman image exists localhost/rlrig:cpu || build_cpu_image

stage "sbatch slurm/rlrig-podman.sbatch on a two-node Slurm (podman, CPU image)"
.venv/bin/python - <<'PY'
import resource
import sys
import tempfile
from pathlib import Path

# a script on stdin: Python searches the current directory (the repository root) first, so `tests` imports
from tests.helpers import slurm  # the two-node Slurm of the integration tests

why = slurm.available()
if why:
    sys.exit(f"FAIL: a real Slurm needs: {why}")
work = Path(tempfile.mkdtemp(prefix="rlrig-slurm-podman-"))
(work / "slurm").symlink_to(Path("slurm").resolve())  # the submit directory holds the recipe, as a checkout does
out = work / "job.out"
tiny = ["trainer.total_training_steps=2", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "trainer.test_freq=-1", "trainer.save_freq=2", "actor_rollout_ref.rollout.name=hf"]
# this machine's hard limits are below 65536 open files and unlimited locked memory: the container takes them
# and runc here refuses a process limit above 4096 in a container (as tests/e2e/run.sh's compose run finds too)
limits = {"RLRIG_NOFILE": str(resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
          "RLRIG_MEMLOCK": str(resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]), "RLRIG_NPROC": "4096"}
env = {"CONTAINER_ENGINE": "podman", "RLRIG_IMAGE": "localhost/rlrig:cpu", "RLRIG_SHM": "2g", "HOME": str(Path.home()),
       **limits}
with slurm.Slurm(2) as s:
    r = s.run("sbatch", "--wait", f"--output={out}", str(work / "slurm/rlrig-podman.sbatch"), *tiny,
              env=env, timeout=900, cwd=work)
    text = out.read_text() if out.exists() else ""
    lines = [l for l in text.splitlines() if "rlrig" in l and ("head of" in l or "workers on" in l or "done:" in l
             or "exited" in l or "rlrig-podman.sbatch" in l)]
    print("\n".join(lines[-8:]))
    metrics = work / "outputs/embedded/metrics.jsonl"
    ok = (r.returncode == 0 and "head of 2 node(s)" in text and f"workers on {s.ns.ip(0)}, {s.ns.ip(1)}" in text
          and metrics.exists() and metrics.read_text().count('"actor/entropy"') == 2)  # two training steps
    if not ok:
        print(text[-3000:], r.stderr)
        sys.exit(f"FAIL: sbatch exited {r.returncode}")
print(f"PASS: podman recipe trained on both Slurm nodes ({metrics})")
PY
left=$(podman ps -q | wc -l)
[ "$left" = 0 ] || { echo "FAIL: $left container(s) left running"; exit 1; }
