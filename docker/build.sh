#!/usr/bin/env bash
# Build one variant of the rlrig image with its pinned base and packages.
#   docker/build.sh cpu|cuda|rocm [more build args]     (ENGINE=podman to use podman)
# Offline builds: put the variant's wheels in docker/wheels/ and pass
#   --build-arg PIP_ARGS="--no-index --find-links /tmp/wheels" --build-arg BASE_IMAGE=localhost/debian-base:bookworm
# (tests/e2e/run.sh: cpu; tests/e2e/cuda_image.sh: cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:?usage: docker/build.sh cpu|cuda|rocm [build args]}
shift
engine=${ENGINE:-docker}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
case "$variant" in
  cpu)
    args=(--build-arg BASE_IMAGE=docker.io/library/debian:bookworm-slim
          --build-arg PRE_PACKAGES="torch==2.13.0"
          --build-arg PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
          --build-arg RLRIG_EXTRAS="tensorboard,data") ;;
  cuda)
    # a plain Debian base: PyPI's torch and vLLM carry CUDA 13.0's libraries; the host brings the driver (>= 580)
    args=(--build-arg BASE_IMAGE=docker.io/library/debian:bookworm-slim
          --build-arg PRE_PACKAGES="vllm==0.32.0 torch==2.13.0"
          --build-arg PIP_ARGS=""
          --build-arg "RLRIG_EXTRAS=tensorboard,wandb,data"
          --build-arg RUNTIME_APT="gcc libc6-dev python3-dev"
          --build-arg CUDA_DRIVER_MIN=580.65.06
          --build-arg NVIDIA_VISIBLE=all
          --build-arg "NVIDIA_CAPABILITIES=compute,utility") ;;
  rocm)
    # AMD's vLLM image for Instinct (CDNA) GPUs, as ROCm 7.14's vLLM page names it: vLLM 0.23.0 takes weights in memory
    # (reload_weights(weights_iterator=...)) and sleeps on ROCm; it brings amdsmi (vLLM's ROCm platform imports it)
    args=(--build-arg BASE_IMAGE=docker.io/rocm/vllm:rocm7.14.0_cdna_ubuntu24.04_py3.14_pytorch_2.11.0_vllm_0.23.0
          --build-arg PRE_PACKAGES=""
          --build-arg PYTHON_APT=""
          --build-arg PIP_ARGS=""
          --build-arg "RLRIG_EXTRAS=tensorboard,wandb,data"
          --build-arg NOSET_HIP=1) ;;
  *) echo "docker/build.sh: unknown variant '$variant'; use cpu, cuda or rocm" >&2; exit 2 ;;
esac
mkdir -p docker/wheels
exec "$engine" build -f docker/Dockerfile --build-arg VARIANT="$variant" --build-arg RLRIG_VERSION="$version" \
  "${args[@]}" -t "rlrig:$version-$variant" -t "rlrig:$variant" "$@" .
