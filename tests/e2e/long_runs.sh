#!/usr/bin/env bash
# The integration tests marked long (pytest -m long): runs of a minute or more whose capability CI checks in a
# shorter test, left out of tests/run.sh to keep CI within its time. Needs root, as the integration tests do; about
# eleven minutes on 2 cores. Run from the repository root:
#   bash tests/e2e/long_runs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/python -m pytest -q -p no:cacheprovider -m long -rs --durations=0 tests/integration "$@"
