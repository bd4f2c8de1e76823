#!/usr/bin/env bash
# Containers end to end, with podman (no Docker engine or registry here): builds the CPU image from a
# local Debian base and local wheels, runs `doctor` in it, then trains across two containers with
# podman-compose. Needs root. About 10 minutes on 2 cores; prints PASS/FAIL per stage.
#   bash tests/e2e/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/e2e/podman_setup.sh

build_cpu_image

stage "doctor in the image, as an arbitrary UID"
json=$(podman run --rm --user 4242:4242 --shm-size=1g localhost/rlrig:cpu doctor --json || true)
echo "$json" | .venv/bin/python -c 'import json,sys; d=json.load(sys.stdin); assert d["launcher"]=="local" and d["nnodes"]==1, d; assert all(c["status"]!="fail" for c in d["checks"]), d["checks"]; print("doctor:", d["launcher"], d["num_cpus"], "CPU", [c["status"] for c in d["checks"]])'

stage "compose: two containers, one Ray cluster, a short training run"
work=$(mktemp -d)
cp compose/compose.yaml "$work/"
.venv/bin/rlrig token --env >"$work/.env"
export RLRIG_NOFILE=$hard
# this machine refuses container rlimits above its own: nproc above 4096 fails in runc here
export RLRIG_STEPS=4 RLRIG_BATCH=8 RLRIG_TEST_FREQ=2 RLRIG_NPROC=4096
set +e
(cd "$work" && timeout 900 "$OLDPWD/.venv/bin/podman-compose" -p rlrige2e up) >"$work/up.log" 2>&1
code=$?
set -e
grep -E "rlrig|exited with code" "$work/up.log" | tail -20 || true
codes=$(podman ps -a --filter label=io.podman.compose.project=rlrige2e --format '{{.Names}} {{.ExitCode}}')
echo "$codes"
ok=1
[ "$code" -eq 0 ] || ok=0
[ -n "$codes" ] && ! grep -qv ' 0$' <<<"$codes" || ok=0
grep -q "2 node(s) alive" "$work/up.log" && grep -q "done: 4 steps" "$work/up.log" || ok=0
(cd "$work" && "$OLDPWD/.venv/bin/podman-compose" -p rlrige2e down -v >/dev/null 2>&1) || true
rm -rf "$work"
if [ "$ok" = 1 ]; then echo "PASS: image build, doctor, compose training"; else echo "FAIL: compose exited $code"; exit 1; fi
