#!/usr/bin/env bash
# Per-node launcher run by srun: starts rlrig in the Apptainer image with this task's SLURM_* passed in.
# `--cleanenv` keeps the host's Python/CUDA variables out of the container, but it also drops every
# SLURM_* variable, and each task's SLURM_NODEID differs, so they are forwarded here, inside the task.
#   srun --ntasks-per-node=1 apptainer/rlrig-node.sh IMAGE.sif train ...
# APPTAINER_GPU_FLAG: --nv (default, NVIDIA) or --rocm (AMD). APPTAINER: apptainer or singularity.
set -euo pipefail
sif=${1:?usage: rlrig-node.sh IMAGE.sif RLRIG-ARGS...}
shift
while IFS= read -r name; do
  export "APPTAINERENV_${name}=${!name}"
done < <(compgen -e | grep -E '^(SLURM_|RLRIG_|RAY_TMPDIR$|HF_TOKEN$|WANDB_API_KEY$)')
exec "${APPTAINER:-apptainer}" run "${APPTAINER_GPU_FLAG:---nv}" --cleanenv "$sif" "$@"
