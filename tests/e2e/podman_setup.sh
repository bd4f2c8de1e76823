# shellcheck shell=bash
# Sourced by the podman e2e scripts: podman with this machine's fixes, the local Debian base image, stage().
# Needs root; leaves `base` naming the base image.
[ "$(id -u)" = 0 ] || { echo "$0: needs root (podman, debootstrap)" >&2; exit 2; }
need=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null 2>&1 || need+=("$tool"); done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# crun fails on this kernel's hybrid cgroups; default rlimits must stay under the host's hard limit
hard=$(ulimit -Hn)
conf=/etc/containers/containers.conf
if ! grep -q "rlrig e2e" "$conf" 2>/dev/null; then
  mkdir -p /etc/containers
  cat >>"$conf" <<CONF
# rlrig e2e
[containers]
default_ulimits = ["nofile=$hard:$hard", "nproc=4096:4096"]
[engine]
runtime = "runc"
CONF
fi
[ -x .venv/bin/python ] || bash tests/run.sh --co -q >/dev/null  # makes .venv with podman-compose

stage() { printf '== %s\n' "$*"; }
base=localhost/debian-base:bookworm
if ! podman image exists "$base"; then
  stage "base image from debootstrap"
  rootfs=$(mktemp -d /var/tmp/rlrig-rootfs.XXXXXX)
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
  tar -C "$rootfs" -c . | podman import - "$base" >/dev/null
  rm -rf "$rootfs"
fi
# docker/wheels is the one wheel folder the Dockerfile mounts: each build fills it for its own variant, then empties it
clear_wheels() { find docker/wheels -name '*.whl' -delete; }

build_cpu_image() {  # localhost/rlrig:cpu from the local base and wheels built here (offline)
  stage "wheels for an offline image build"
  clear_wheels
  .venv/bin/python -m pip wheel -q --wheel-dir docker/wheels ".[tensorboard,debug,data]" "torch==2.13.0" setuptools wheel
  stage "podman build (cpu variant)"
  ENGINE=podman docker/build.sh cpu --format docker --build-arg BASE_IMAGE="$base" \
    --build-arg PIP_ARGS="--no-index --find-links /tmp/wheels" -q >/dev/null
  clear_wheels
  podman image inspect localhost/rlrig:cpu --format '{{index .Labels "org.opencontainers.image.title"}} {{.Config.User}}'
  # the torch stack pinned for any later pip install in the image
  podman run --rm --entrypoint bash localhost/rlrig:cpu -c 'echo "PIP_CONSTRAINT=$PIP_CONSTRAINT:" $(cat "$PIP_CONSTRAINT")' \
    | tee /dev/stderr | grep -q "torch==2.13.0"
}
