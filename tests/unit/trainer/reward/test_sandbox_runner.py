"""rlrig sandbox's runner: each submission's limits, table-driven (each case a second or two at most), and that the
runner goes on after each. What the isolation enforces depends on the machine (root: a uid per slot and network
and mount namespaces); the expectations follow what it says it enforces."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from rlrig.trainer.reward.sandbox import isolation
from rlrig.trainer.reward.sandbox.languages import Toolchain
from rlrig.trainer.reward.sandbox.protocol import RunCodeRequest
from rlrig.trainer.reward.sandbox.runner import Limits, Runner


@pytest.fixture(scope="module")
def runner():
    work = isolation.work_dir(root=os.geteuid() == 0)
    iso = isolation.detect(work)
    yield Runner(Limits(memory_mb=512, timeout=5, max_processes=32), 2, work, iso, Toolchain.detect(iso.own_uid))
    shutil.rmtree(work, ignore_errors=True)


def run(runner, code, language="python", stdin=None, timeout=5):
    return runner.run(RunCodeRequest(code=code, language=language, stdin=stdin, run_timeout=timeout))


FORK_BOMB = """import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
CONNECT = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)\n"


@pytest.mark.parametrize(
    "code, status, run_status, check",
    [
        ("print(input()[::-1])", "Success", "Finished", lambda r: r.return_code == 0 and r.stdout == "cba\n"),
        ("while True:\n    pass\n", "Failed", "TimeLimitExceeded", lambda r: r.return_code is None),
        (FORK_BOMB, "Failed", "TimeLimitExceeded", lambda r: True),
        ("x = bytearray(10 * 1024**3)\n", "Failed", "Finished", lambda r: "MemoryError" in r.stderr),
        (CONNECT, "Failed", "Finished", lambda r: r.return_code == 1 and "Error" in r.stderr),
        # RLIMIT_FSIZE: output past the limit ends the program (a file too large), not the service's memory
        ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", "Failed", "Finished", lambda r: True),
        ("import sys\nsys.exit(3)\n", "Failed", "Finished", lambda r: r.return_code == 3),
    ],
    ids=["correct", "infinite-loop", "fork-bomb", "allocate-10GB", "connect", "unbounded-output", "exit-3"],
)
def test_limits(runner, code, status, run_status, check):
    resp = run(runner, code, stdin="abc", timeout=1 if run_status == "TimeLimitExceeded" else 5)
    assert (resp.status, resp.run_result.status) == (status, run_status), resp
    assert check(resp.run_result), resp.run_result
    if runner.iso.own_uid:  # nothing of the submission outlives it
        assert isolation.processes_of(isolation.SLOT_UID_BASE) == []
        assert isolation.processes_of(isolation.SLOT_UID_BASE + 1) == []
    assert run(runner, "print(1)").run_result.stdout == "1\n"  # and the runner goes on


def test_writes_outside_scratch(runner, tmp_path):
    """Its own directory is writable; the one above it is not (a slot's uid as root); /tmp is its own, thrown away
    (root's mount namespace)."""
    here = run(runner, "open('f', 'w').write('x')\nprint(open('f').read())\n")
    assert here.run_result.stdout == "x\n"
    up = run(runner, "open('../escape', 'w').write('x')\n")
    marker = Path("/tmp") / f"rlrig-sandbox-test-{os.getpid()}"
    tmp = run(runner, f"open({str(marker)!r}, 'w').write('x')\n")
    if runner.iso.own_uid:
        assert up.run_result.return_code == 1 and "PermissionError" in up.run_result.stderr
        assert not list(runner.runs.glob("escape"))
    if runner.iso.private_tmp:
        assert tmp.status == "Success" and not marker.exists()
    marker.unlink(missing_ok=True)


def test_background_process_is_killed(runner):
    resp = run(runner, "sleep 30 &\necho started\n", language="bash")
    assert resp.status == "Success" and resp.run_result.stdout == "started\n"
    if runner.iso.own_uid:
        assert isolation.processes_of(isolation.SLOT_UID_BASE) == []


def test_scratch_is_removed(runner):
    run(runner, "open('left', 'w').write('x')\n")
    assert list(runner.runs.iterdir()) == []


def test_files_and_fetch_files(runner):
    import base64

    req = RunCodeRequest(
        code="print(open('data/in.txt').read()); open('out.txt', 'w').write('done')",
        language="python",
        files={"data/in.txt": base64.b64encode(b"given").decode()},
        fetch_files=["out.txt", "missing.txt"],
    )
    resp = runner.run(req)
    assert resp.run_result.stdout == "given\n"
    assert resp.files == {"out.txt": base64.b64encode(b"done").decode()}


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (the cpp language)")
def test_cpp_compiles_then_runs(runner):
    ok = run(runner, '#include <cstdio>\nint main(){int a;scanf("%d",&a);printf("%d\\n",2*a);}', "cpp", "21", 5)
    assert ok.status == "Success" and ok.run_result.stdout == "42\n"
    bad = run(runner, "int main( {", "cpp", None, 5)
    assert bad.status == "Failed" and bad.run_result is None and bad.compile_result.return_code != 0


def test_language_not_here(runner):
    bare = Runner(runner.limits, 1, runner.runs.parent, runner.iso, Toolchain(runner.tools.python, {}))
    resp = bare.run(RunCodeRequest(code="int main(){}", language="cpp"))
    assert resp.status == "SandboxError" and resp.run_result is None
    assert (
        resp.message
        == "language cpp is not available on this sandbox: install g++ (Debian/Ubuntu: apt-get install g++)"
    )
    assert "not run by rlrig sandbox" in run(runner, "x", language="lean").message
    assert "not a language rlrig sandbox knows" in run(runner, "x", language="cobol").message


def test_pytest_runs_where_the_sandbox_python_has_it(runner):
    resp = run(runner, "def test_sum():\n    assert 1 + 1 == 2\n", language="pytest")
    if "{pytest}" in runner.tools.paths:
        assert resp.status == "Success" and "1 passed" in resp.run_result.stdout
    else:
        assert resp.message == (
            "language pytest is not available on this sandbox: install pytest for the sandbox's Python "
            "(pip install pytest)"
        )
