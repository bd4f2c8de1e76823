#!/usr/bin/env bash
# The project's one test command (README, CI): installs rlrig and its test tools into .venv, then runs
# every test. Integration tests need root for network namespaces; elsewhere they skip and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: a CPU build where one is at hand, rather than an unpinned multi-GB CUDA download.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[test]"
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
