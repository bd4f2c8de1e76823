"""`rlrig sandbox` through its public protocol: HTTP POST /run_code exactly as verl 0.9.1's client sends it
(verl/utils/reward_score/sandbox_fusion/utils.py's call_sandbox_api: its JSON body and headers), and rlrig's own
code reward (reward/sandbox_fusion.py) scoring against it."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward import rules
from rlrig.trainer.reward.sandbox.cli import start
from rlrig.trainer.reward.sandbox_fusion import SandboxClient, case_result, compute_score, extract_code


@pytest.fixture(scope="module")
def url():
    server = start("127.0.0.1", 0, max_concurrency=1, memory_limit_mb=512, timeout=5)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.url
    server.shutdown()
    server.server_close()
    shutil.rmtree(server.work_dir, ignore_errors=True)


def post(url: str, body: dict | bytes) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def verl_body(code: str, stdin: str | None = None, language: str = "python", timeout: int = 2) -> dict:
    """call_sandbox_api's payload, field for field."""
    return {
        "compile_timeout": timeout,
        "run_timeout": timeout,
        "code": code,
        "stdin": stdin,
        "memory_limit_MB": 1024,
        "language": language,
        "files": {},
        "fetch_files": [],
    }


def test_run_code_as_verl_sends_it(url):
    code, answer = post(url, verl_body("a, b = map(int, input().split())\nprint(a + b)", "2 3\n"))
    assert code == 200
    assert set(answer) == {"status", "message", "compile_result", "run_result", "executor_pod_name", "files"}
    assert answer["status"] == "Success" and answer["compile_result"] is None
    run = answer["run_result"]
    assert set(run) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert (run["status"], run["return_code"], run["stdout"]) == ("Finished", 0, "5\n")
    assert case_result(answer, "5") is True and case_result(answer, "6") is False


def test_failures_in_protocol_terms(url):
    _, looped = post(url, verl_body("while True: pass", timeout=1))
    assert looped["status"] == "Failed" and looped["run_result"]["status"] == "TimeLimitExceeded"
    assert case_result(looped, "x") == -3
    _, raised = post(url, verl_body("raise SystemExit(2)"))
    assert raised["run_result"]["return_code"] == 2 and case_result(raised, "x") == -2
    _, missing = post(url, verl_body("x", language="lean"))
    assert missing["status"] == "SandboxError" and case_result(missing, "x") == -1


def test_bad_requests(url):
    assert post(url, b"{not json")[0] == 422
    code, answer = post(url, {"language": "python"})
    assert code == 422 and answer["detail"] == "code must be a string"
    assert post(url, {**verl_body("x"), "files": {"../x": ""}})[0] == 422
    assert post(url.replace("/run_code", "/other"), verl_body("x"))[0] == 404
    with urllib.request.urlopen(url.replace("/run_code", "/v1/ping"), timeout=10) as resp:
        assert resp.read() == b"pong"


def test_requests_past_the_concurrency_wait(url):
    """max_concurrency=1: two sleeps of 0.5 s take about 1 s, both answered."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: post(url, verl_body("import time; time.sleep(0.5)")), range(2)))
    assert [a[1]["status"] for a in answers] == ["Success", "Success"]
    assert time.monotonic() - t0 >= 0.9


TESTS = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 -3\n"], "outputs": ["3\n", "7\n", "7\n"]})


@pytest.mark.parametrize(
    "completion, score",
    [
        ("```python\na, b = map(int, input().split())\nprint(a + b)\n```", 1.0),
        ("```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n```", 2 / 3),
        ("print(1)", 0.0),  # no code block
    ],
)
def test_code_reward_through_the_service(url, completion, score):
    client = SandboxClient.of(url, 4, 256)
    assert compute_score(client, completion, TESTS) == pytest.approx(score)


def test_a_program_that_loops_scores_zero(url, monkeypatch):
    from rlrig.trainer.reward import sandbox_fusion

    monkeypatch.setattr(sandbox_fusion, "CASE_TIMEOUT", 1)
    client = SandboxClient.of(url, 4, 256)
    cases = {"inputs": ["1 2\n"], "outputs": ["3\n"]}
    assert compute_score(client, "```python\nwhile True: pass\n```", cases) == 0.0


def test_function_cases_and_the_default_reward(url):
    """A fn_name case runs verl's wrapper; rlrig's default compute_score scores a code data_source with it."""
    fn_cases = {"inputs": ["1\n2", "[1, 2]\n[3]"], "outputs": ["3", "[1, 2, 3]"], "fn_name": "add"}
    completion = "```python\ndef add(a, b):\n    return a + b\n```"
    client = SandboxClient.of(url, 4, 256)
    assert rules.default_compute_score("codecontests", completion, fn_cases, None, sandbox=client) == 1.0
    with pytest.raises(ValueError, match="no rule-based reward"):
        rules.default_compute_score("codecontests", completion, fn_cases)


def test_unreachable_sandbox_scores_zero():
    client = SandboxClient.of("http://127.0.0.1:9/run_code", 1, 256)
    assert compute_score(client, "```python\nprint(1)\n```", {"inputs": [""], "outputs": ["1"]}) == 0.0


def test_extract_code_as_verl():
    assert extract_code("a ```python\nx=1\n``` b ```python\ny=2\n```") == "\ny=2\n"
    assert extract_code("```cpp\nint main(){}\n```") == "int main(){}\n"
    assert extract_code("no block") is None


def test_code_rows_need_a_sandbox():
    with pytest.raises(ConfigError, match=r"'apps' is scored by running its code: set reward_model.sandbox_fusion.url"):
        rules.check_sources({"apps", "openai/gsm8k"}, None)
    rules.check_sources({"apps", "openai/gsm8k"}, None, "http://sandbox:8080/run_code")
