#!/usr/bin/env bash
# `rlrig sandbox` against verl's own SandboxFusion client: verl 0.9.1's default_compute_score (code data sources,
# test cases from stdin and by function call) and its call_sandbox_api, run by verl's Python against a sandbox
# started here. VERL_PYTHON: a Python with verl 0.9.1 and requests installed (else one is made from PyPI as
# verl_dataset_e2e.sh makes it). About ten seconds with VERL_PYTHON. Run from the repository root:
#   VERL_PYTHON=/path/to/venv/bin/python bash tests/e2e/verl_sandbox_e2e.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
sandbox=""
touch "$work/sandbox.log"
trap '[ -n "$sandbox" ] && kill "$sandbox"; rm -rf "$work"' EXIT
py=${VERL_PYTHON:-}
if [ -z "$py" ]; then
  . tests/e2e/verl_venv.sh
  make_verl_venv "$work" verl==0.9.1 tensordict==0.10.0
  "$work/venv/bin/pip" install -q requests
  py="$work/venv/bin/python"
fi
.venv/bin/rlrig sandbox --port 0 --max-concurrency 2 --timeout 3 >"$work/sandbox.log" 2>&1 &
sandbox=$!
for _ in $(seq 100); do grep -q "run_code" "$work/sandbox.log" && break; sleep 0.1; done
url=$(grep -o 'http://[^ ]*/run_code' "$work/sandbox.log" | head -1)
cat "$work/sandbox.log"
"$py" - "$url" <<'PY'
import json
import sys
import threading

from verl.utils.reward_score import default_compute_score
from verl.utils.reward_score.sandbox_fusion.utils import call_sandbox_api

url, sem = sys.argv[1], threading.Semaphore(4)
stdin_cases = json.dumps({"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]})
fn_cases = json.dumps({"inputs": ["1\n2", "[1]\n[2]"], "outputs": ["3", "[1, 2]"], "fn_name": "add"})
rows = [
    ("codecontests", "```python\na, b = map(int, input().split())\nprint(a + b)\n```", stdin_cases, 1.0),
    ("apps", "```python\na, b = map(int, input().split())\nprint(a * b)\n```", stdin_cases, 0.0),
    ("taco", "```python\nwhile True:\n    pass\n```", stdin_cases, 0.0),
    ("codeforces", "```python\nimport os\nwhile True:\n    os.fork()\n```", stdin_cases, 0.0),
    ("codecontests", "```python\nx = bytearray(10 * 1024**3)\n```", stdin_cases, 0.0),
    ("codecontests", "```python\nimport socket\nsocket.create_connection(('1.1.1.1', 53), 1)\n```", stdin_cases, 0.0),
    ("apps", "```python\ndef add(a, b):\n    return a + b\n```", fn_cases, 1.0),
]
for source, completion, cases, want in rows:
    got = default_compute_score(source, completion, cases, None, url, sem, 512)
    print(f"{source:13s} {want} {got} {completion.splitlines()[1][:40]}")
    assert got == want, (source, completion, got)
answer, error = call_sandbox_api(url, "print('hi')", None, 3, 3, 512, "python")
assert error is None and answer["run_result"]["stdout"] == "hi\n", (answer, error)
answer, error = call_sandbox_api(url, "package main", None, 3, 3, 512, "go")
print(answer.get("message") if answer else error)
assert answer["status"] in ("SandboxError", "Success", "Failed"), answer
print("verl's sandbox-fusion client scored every row as expected through rlrig sandbox")
PY
