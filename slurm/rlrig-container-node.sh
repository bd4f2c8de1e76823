#!/usr/bin/env bash
# Per-node launcher run by srun: rlrig in a docker or podman container with this task's SLURM_* passed in (the
# pattern of AMD's Slurm guide, without its per-rank code: rlrig reads the rank itself).
#   srun --ntasks-per-node=1 slurm/rlrig-container-node.sh IMAGE train ...
# CONTAINER_ENGINE: docker (default) or podman.  RLRIG_GPUS: nvidia (default), amd or none.
# RLRIG_SHM: the container's /dev/shm (default 64g).  RLRIG_MOUNTS: extra "-v" specs, space-separated.
# RLRIG_NOFILE / RLRIG_MEMLOCK / RLRIG_NPROC: the container's open-files, locked-memory and process limits (65536;
# -1, unlimited, which InfiniBand needs; this task's own hard limit). A Slurm task may lack CAP_SYS_RESOURCE, so no
# limit may exceed the task's hard one (podman fills in any limit not given with its own, higher, default).
set -euo pipefail
image=${1:?usage: rlrig-container-node.sh IMAGE RLRIG-ARGS...}
shift
engine=${CONTAINER_ENGINE:-docker}
nofile=${RLRIG_NOFILE:-65536}
memlock=${RLRIG_MEMLOCK:--1}
nproc=${RLRIG_NPROC:-$(ulimit -Hu)}
[ "$nproc" = unlimited ] && nproc=-1
# host networking: Ray and NCCL advertise the node's own address; the image's tini is already PID 1
args=(run --rm --network host --shm-size "${RLRIG_SHM:-64g}" --ulimit "nofile=$nofile:$nofile"
      --ulimit "memlock=$memlock:$memlock" --ulimit "nproc=$nproc:$nproc")
# as the submitting user, so checkpoints and outputs in the mounted directories are theirs (the image runs as any
# UID); rootless podman maps that user through its own user namespace instead
if [ "$engine" = podman ] && [ "$(id -u)" != 0 ]; then args+=(--userns keep-id); else args+=(--user "$(id -u):$(id -g)"); fi
case "${RLRIG_GPUS:-nvidia}" in
  nvidia) args+=(--gpus all) ;;
  # /dev/kfd and /dev/dri belong to the host's render and video groups: the image's user must be in both
  amd) args+=(--device /dev/kfd --device /dev/dri --group-add video --group-add render) ;;
  none) ;;
  *) echo "rlrig-container-node.sh: RLRIG_GPUS=$RLRIG_GPUS; use nvidia, amd or none" >&2; exit 2 ;;
esac
# Each task's SLURM_NODEID/SLURM_PROCID differ, so the variables are read here, inside the task, and passed by
# name (-e NAME takes the value from this environment: no token on the command line for `ps` to show).
while IFS= read -r name; do
  args+=(-e "$name")
done < <(compgen -e | grep -E '^(SLURM_|RLRIG_|RAY_TMPDIR$|HF_TOKEN$|WANDB_API_KEY$|CUDA_VISIBLE_DEVICES$|HIP_VISIBLE_DEVICES$)')
# Ray's temp dir must be the same path inside and out: rlrig names it in logs, and `rlrig down` looks there
if [ -n "${RAY_TMPDIR:-}" ]; then mkdir -p "$RAY_TMPDIR"; args+=(-v "$RAY_TMPDIR:$RAY_TMPDIR"); fi
for mount in ${RLRIG_MOUNTS:-}; do args+=(-v "$mount"); done
# exec: Slurm's signals (scancel's SIGTERM, --signal=USR1@T) reach the engine's client, which passes them on to the
# container (--sig-proxy, on by default in docker and podman); rlrig checkpoints within --grace-period. Slurm's
# KillWait should exceed that grace, or the client is killed first and the container finishes on its own (--rm).
exec "$engine" "${args[@]}" "$image" "$@"
