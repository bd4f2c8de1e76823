#!/usr/bin/env bash
# The CUDA image, built for real with podman from the local Debian base and PyPI's wheels (vLLM 0.32, torch 2.13
# CUDA 13.0; about 4 GB of wheels), then checked on this GPU-less machine: its labels, its size, `doctor` and the
# seconds to its output, `import vllm` with torch's CUDA build, a short `rlrig train` on CPU with the hf engine, and the
# trainer's and entrypoint's unit tests run by the image's own Python stack (its transformers is the one vLLM pins).
# Needs root and PyPI; outside CI (downloads and a build of many minutes). Prints PASS/FAIL per stage.
#   bash tests/e2e/cuda_image.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/e2e/podman_setup.sh
image=localhost/rlrig:cuda

stage "wheels from PyPI (not this machine's CPU torch: --isolated leaves out its pip config)"
clear_wheels
# the cert flag: --isolated also drops PIP_CERT, which machines behind a proxy need
.venv/bin/python -m pip --isolated wheel -q --cert "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" \
  --wheel-dir docker/wheels "vllm==0.32.0" "torch==2.13.0" ".[tensorboard,wandb,debug,data]" setuptools wheel
compgen -G 'docker/wheels/torch-2.13.0-*.whl' >/dev/null || { echo "FAIL: no CUDA torch wheel in docker/wheels"; exit 1; }
echo "wheels: $(du -sh docker/wheels | cut -f1)"

stage "podman build (cuda variant)"
t0=$(date +%s)
ENGINE=podman docker/build.sh cuda --format docker --build-arg BASE_IMAGE="$base" \
  --build-arg PIP_ARGS="--no-index --find-links /tmp/wheels" -q >/dev/null
echo "built in $(( $(date +%s) - t0 )) s"
clear_wheels
podman image inspect "$image" --format \
  'labels: {{index .Labels "io.rlrig.variant"}} driver>={{index .Labels "io.rlrig.cuda-driver-min"}} user {{.Config.User}}'
[ "$(podman image inspect "$image" --format '{{index .Labels "io.rlrig.cuda-driver-min"}}')" = 580.65.06 ]
size=$(podman image inspect "$image" --format '{{.Size}}')
layers=$(podman history -q "$image" | wc -l)
echo "size: $(( size / 1024 / 1024 )) MiB in $layers layers; largest:"
podman history --format '{{.Size}}\t{{.CreatedBy}}' "$image" | grep -E '^[0-9.]+ (MB|GB)' | cut -c1-110

stage "what is inside: torch's CUDA build, vLLM, a C compiler for Triton, no wheel left behind"
podman run --rm --entrypoint python "$image" -c '
import shutil, sysconfig, os, torch, vllm
assert torch.version.cuda and torch.version.cuda.startswith("13."), torch.version.cuda
assert shutil.which("gcc") and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
assert not os.path.exists("/tmp/wheels") or not os.listdir("/tmp/wheels")
print("torch", torch.__version__, "CUDA", torch.version.cuda, "| vllm", vllm.__version__)
' 2>&1 | grep -v "^INFO\|^WARNING" | tail -2

stage "the torch stack pinned for later pip installs (SGLang must not replace vLLM's torch)"
constraints=$(podman run --rm --entrypoint sh "$image" -c 'echo "PIP_CONSTRAINT=$PIP_CONSTRAINT"; cat "$PIP_CONSTRAINT"')
echo "$constraints"
grep -qx 'torch==2.13.0' <<<"$constraints" && grep -qx 'vllm==0.32.0' <<<"$constraints"
# pip names the constraint in its refusal (without reaching an index: no torch satisfies both pins)
refusal=$(podman run --rm --entrypoint pip "$image" install --dry-run --no-deps "torch==2.14.1" 2>&1 || true)
grep -q "(constraint) torch==2.13.0" <<<"$refusal" || { echo "FAIL: pip did not refuse by the constraint: $refusal"; exit 1; }
echo "pip install torch==2.14.1 in the image: refused, naming the constraint torch==2.13.0"

stage "doctor in the image, as an arbitrary UID, timed"
t0=$EPOCHREALTIME
json=$(podman run --rm --user 4242:4242 --shm-size=1g "$image" doctor --json || true)
t1=$EPOCHREALTIME
echo "$json" | .venv/bin/python -c 'import json,sys; d=json.load(sys.stdin); assert d["launcher"]=="local", d; assert all(c["status"]!="fail" for c in d["checks"]), d["checks"]; print("doctor:", d["launcher"], d["num_cpus"], "CPU", [c["status"] for c in d["checks"]])'
.venv/bin/python -c "print(f'doctor: {$t1 - $t0:.1f} s from podman run to its output')"

stage "rlrig train on CPU with the hf engine (4 steps)"
log=$(mktemp)
set +e
podman run --rm --shm-size=2g "$image" train actor_rollout_ref.rollout.name=hf trainer.total_training_steps=4 \
  data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.test_freq=2 trainer.save_freq=-1 >"$log" 2>&1
code=$?
set -e
grep -E "^rlrig|done:" "$log" | tail -5
ok=1
[ "$code" -eq 0 ] && grep -q "done: 4 steps" "$log" || ok=0
rm -f "$log"
[ "$ok" = 1 ] || { echo "FAIL: train exited $code"; exit 1; }

stage "the trainer's and entrypoint's unit tests inside the image, on its own stack (transformers as vLLM pins it), on CPU"
# pytest and what it needs beyond the image (--no-deps: the image's own packaging stays), beside it in /tmp, not in
# the image's venv; the tests and rlrig's sources come from this checkout, read-only, the sources ahead of the
# installed copy on the path (rlrig is a namespace package), so a fix is tested without a rebuild
testwheels=$(mktemp -d) && chmod 755 "$testwheels"  # readable by the image's user
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$testwheels" \
  "pytest==$(.venv/bin/python -c 'import pytest; print(pytest.__version__)')" iniconfig pluggy pygments
set +e
podman run --rm --shm-size=2g --entrypoint bash -e PYTHONDONTWRITEBYTECODE=1 -e PIP_CONSTRAINT= -w /work \
  -v "$PWD/tests:/work/tests:ro" -v "$PWD/pyproject.toml:/work/pyproject.toml:ro" \
  -v "$PWD/trainer:/work/src/rlrig/trainer:ro" \
  -v "$PWD/entrypoint:/work/src/rlrig/entrypoint:ro" -v "$testwheels:/tmp/testwheels:ro" "$image" -c '
    pip install -q --no-index --no-deps --target /tmp/pytest /tmp/testwheels/*.whl || exit 1
    export PYTHONPATH=/work/src:/work:/tmp/pytest
    python -c "import torch, transformers, ray, rlrig.trainer; print(\"stack:\", \"torch\", torch.__version__, \"transformers\", transformers.__version__, \"ray\", ray.__version__, \"rlrig from\", rlrig.trainer.__path__[0])"
    python -m pytest -q -p no:cacheprovider -rs tests/unit/trainer tests/unit/entrypoint' 2>&1 | tee /tmp/cuda-image-units.log \
  | grep -E "^stack:|passed|failed|^FAILED|^ERROR|^SKIPPED"
code=${PIPESTATUS[0]}
set -e
rm -rf "$testwheels"
[ "$code" -eq 0 ] || { echo "FAIL: the unit tests in the image exited $code (log: /tmp/cuda-image-units.log)"; exit 1; }
echo "PASS: cuda image build, contents, doctor, CPU training, unit tests on the image's stack"
