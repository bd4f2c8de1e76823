#!/usr/bin/env bash
# The project's one test command (README, CI): installs rlrig and its test tools into .venv, then runs
# every test. Integration tests need root for network namespaces; elsewhere they skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
pip_install() {  # quiet unless it fails
  .venv/bin/python -m pip install -q "$@" >.venv/pip.log 2>&1 || { tail -40 .venv/pip.log; exit 1; }
}
pip_install --upgrade pip
# torch first and pinned: a CPU build where one is at hand, rather than an unpinned multi-GB CUDA download.
.venv/bin/python -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
pip_install -e ".[test]"
# SkyPilot's own YAML parser, in a venv of its own: it pins click below what transformers' hub client needs
if [ ! -x .venv-sky/bin/python ]; then
  "$PY" -m venv .venv-sky
  .venv-sky/bin/python -m pip install -q "skypilot==0.14.1" >.venv-sky/pip.log 2>&1 || { tail -40 .venv-sky/pip.log; exit 1; }
fi
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
