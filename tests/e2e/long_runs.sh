#!/usr/bin/env bash
# The tests marked long (pytest -m long): runs of a minute or more whose capability CI checks in a shorter test, left
# out of tests/run.sh to keep CI within its time. The integration ones, then the vLLM tier's in .venv-vllm (which
# tests/run.sh makes). Needs root, as the integration tests do; about fifteen minutes on 2 cores. From the repository
# root:
#   bash tests/e2e/long_runs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider -m long -rs --durations=0 tests/integration tests/unit "$@" || status=$?
if [ -x .venv-vllm/bin/python ]; then
  PATH="$PWD/.venv-vllm/bin:$PATH" .venv-vllm/bin/python -m pytest -q -p no:cacheprovider -m long -rs --durations=0 \
    tests/vllm_tier "$@" || status=$?
else
  echo "tests/e2e/long_runs.sh: no .venv-vllm here (bash tests/run.sh makes it); the vLLM tier's long runs left out" >&2
  status=1
fi
exit $status
