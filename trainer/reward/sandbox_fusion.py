"""Code rewards through a SandboxFusion service (verl 0.9.1's verl/utils/reward_score/sandbox_fusion): the code
block of a response is run against the row's test cases, one /run_code request per case, and the score is the
fraction of the first ten cases that pass (verl's continuous=True, what its default_compute_score asks).

A case's result, as verl's: True (its stdout, trailing newlines aside, is the expected output), False (it is not),
-1 (the sandbox could not be asked or answered SandboxError), -2 (a runtime error or a non-zero exit), -3 (a time
limit), -4 (a compile error; every later case counts as one too). Only True scores."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .code_wrapper import FUNCTION_CALL

log = logging.getLogger(__name__)

# verl 0.9.1's default_compute_score sends these data sources to the sandbox
CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")
CASE_TIMEOUT = 10  # seconds to compile and to run each case (verl's default)
RETRIES, API_TIMEOUT = 3, 10  # verl retries a 504 twice, after 1 s then 2 s; the request waits the timeouts + 10 s


@dataclass
class SandboxClient:
    """A SandboxFusion /run_code endpoint as verl's reward uses one: `semaphore` bounds this process's requests in
    flight (reward_model.sandbox_fusion.max_concurrent), memory_limit_mb goes with every request."""

    url: str
    semaphore: threading.Semaphore
    memory_limit_mb: int

    @classmethod
    def of(cls, url: str, max_concurrent: int, memory_limit_mb: int) -> SandboxClient:
        return cls(url, threading.Semaphore(max_concurrent), memory_limit_mb)

    def run(self, code: str, stdin: str | None, timeout: int, language: str = "python") -> tuple[dict | None, str]:
        """(the JSON answer, "") or (None, why not): 504 retried as verl retries it, other errors not."""
        body = {
            "compile_timeout": timeout,
            "run_timeout": timeout,
            "code": code,
            "stdin": stdin,
            "memory_limit_MB": self.memory_limit_mb,
            "language": language,
            "files": {},
            "fetch_files": [],
        }
        req = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        error = ""
        for attempt in range(RETRIES):
            try:
                with self.semaphore, urllib.request.urlopen(req, timeout=2 * timeout + API_TIMEOUT) as resp:
                    return json.loads(resp.read()), ""
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code} from {self.url}"
                if e.code != 504:
                    break
                if attempt < RETRIES - 1:
                    time.sleep(attempt + 1)
            except (OSError, ValueError) as e:  # unreachable, timed out, or not JSON
                error = f"{type(e).__name__} from {self.url}: {e}"
                break
        return None, error


def extract_code(completion: str) -> str | None:
    """The code of a response as verl takes it: the last ```python block, else the first ``` block (a language
    name on its first line dropped); None without a block."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    if "```" not in completion:
        return None
    parts = completion.split("```")
    solution = parts[1] if len(parts) >= 2 else completion
    if "\n" in solution:
        first, rest = solution.split("\n", 1)
        if first.strip().isalpha():
            solution = rest
    return solution


def parse_cases(ground_truth) -> dict | None:
    """The row's test cases ({"inputs", "outputs"[, "fn_name"][, "assert_case"]}, a dict or its JSON); None where
    they are not that."""
    cases = ground_truth
    if not isinstance(cases, dict):
        try:
            cases = json.loads(cases)
        except (TypeError, json.JSONDecodeError):
            return None
    if not isinstance(cases, dict):
        return None
    if isinstance(cases.get("assert_case"), list):
        cases.setdefault("inputs", ["" for _ in cases["assert_case"]])
        cases.setdefault("outputs", [None for _ in cases["assert_case"]])
    if "inputs" not in cases or "outputs" not in cases:
        return None
    return cases


def case_result(answer: dict | None, expected) -> bool | int:
    """One case's result (module docstring) from the sandbox's answer (None: it could not be asked)."""
    if answer is None or answer.get("status") == "SandboxError":
        return -1
    compiled, ran = answer.get("compile_result"), answer.get("run_result")
    if answer.get("status") == "Failed":
        if compiled and (
            compiled.get("status") in ("Error", "TimeLimitExceeded")
            or (compiled.get("status") == "Finished" and compiled.get("return_code") != 0)
        ):
            return -4
        if not ran:
            return -1
        if ran.get("status") == "TimeLimitExceeded":
            return -3
        if ran.get("status") == "Error" or (ran.get("status") == "Finished" and ran.get("return_code") != 0):
            return -2
        return -1
    if answer.get("status") == "Success" and ran and ran.get("status") == "Finished":
        out = ran.get("stdout") or ""
        return expected is None or str(out).rstrip("\n") == str(expected).rstrip("\n")
    return -1


def check_cases(client: SandboxClient, cases: dict, code: str, timeout: int = CASE_TIMEOUT) -> list[bool | int]:
    """Every case's result, the cases run concurrently (the client's semaphore bounds them)."""
    inputs, outputs = cases["inputs"], cases["outputs"]
    asserts = cases.get("assert_case", [""] * len(inputs))
    if len(inputs) != len(outputs) or len(asserts) != len(inputs):
        return [-1] * len(inputs)
    fn_name = cases.get("fn_name")

    def one(i: int) -> bool | int:
        program = code + "\n\n" + asserts[i]
        if fn_name:
            program = FUNCTION_CALL.format(generation=program, fn_name=fn_name)
        answer, error = client.run(program, None if inputs[i] is None else str(inputs[i]), timeout)
        if error:
            log.warning("sandbox fusion: case %d: %s", i, error)
        return case_result(answer, outputs[i])

    with ThreadPoolExecutor(max_workers=max(1, min(len(inputs), 32))) as pool:
        results = list(pool.map(one, range(len(inputs))))
    first_compile_error = next((i for i, r in enumerate(results) if r == -4), None)
    if first_compile_error is not None:
        results[first_compile_error:] = [-4] * (len(results) - first_compile_error)
    return results


def compute_score(client: SandboxClient, completion: str, ground_truth, continuous: bool = True) -> float:
    """verl's sandbox_fusion.compute_score's score: the passing fraction of the first 10 cases (continuous) or of
    all; 0.0 without a code block or with test cases that are not {"inputs", "outputs"}."""
    code = extract_code(completion)
    cases = parse_cases(ground_truth) if code is not None else None
    if code is None or cases is None:
        return 0.0
    results = check_cases(client, cases, code, CASE_TIMEOUT)
    if not results:
        return 0.0
    considered = results[:10] if continuous else results
    return sum(1 for r in considered if r is True) / len(considered)
