"""Running one submission: a throwaway scratch directory, the language's compile and run commands under the
isolation and resource limits, its outputs read back, and everything it left behind killed and deleted."""

from __future__ import annotations

import base64
import math
import os
import queue
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import isolation
from .languages import LANGUAGES, Language, Toolchain
from .protocol import ERROR, FAILED, FINISHED, SUCCESS, TIME_LIMIT, CommandResult, RunCodeRequest, RunCodeResponse

MB = 1024 * 1024
COMPILE_MEMORY_MB = 2048  # compilers get at least this much address space, whatever the run's limit


@dataclass(frozen=True)
class Limits:
    """The sandbox's ceilings. A request's memory_limit_MB and timeouts are taken up to memory_mb and timeout
    (memory_limit_MB <= 0 gets memory_mb); the others hold for every submission."""

    memory_mb: int = 1024  # RLIMIT_AS (the address space) of each process
    timeout: float = 30.0  # wall-clock seconds of a compile or a run; RLIMIT_CPU is this rounded up, plus 1
    max_processes: int = 64  # RLIMIT_NPROC: processes and threads of the submission's uid
    file_size_mb: int = 64  # RLIMIT_FSIZE: the largest file it may write, its stdout and stderr included
    open_files: int = 256  # RLIMIT_NOFILE


@dataclass(frozen=True)
class _Command:
    argv: list[str]
    timeout: float
    memory_mb: int
    address_space: bool
    stdin: str | None


class Runner:
    """Runs submissions with `isolation`'s walls and `limits`, at most max_concurrency at once: a request beyond
    that waits for a slot (each slot has its own uid as root). run() never raises for what the code does: a
    submission that loops, forks, allocates or writes without bound is stopped and answered in the protocol's
    terms (TimeLimitExceeded, a non-zero return_code, Failed)."""

    def __init__(
        self, limits: Limits, max_concurrency: int, work_dir: Path, iso: isolation.Isolation, tools: Toolchain
    ):
        self.limits, self.iso, self.tools = limits, iso, tools
        self.runs = work_dir / "runs"  # root's, searchable but not listable: a slot reaches only its own scratch
        self.io = work_dir / "io"  # the parent's stdin/stdout/stderr files, out of every submission's reach
        for d, mode in ((self.runs, 0o711), (self.io, 0o700)):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(mode)
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(max_concurrency):
            self._slots.put(slot)

    def run(self, req: RunCodeRequest) -> RunCodeResponse:
        refusal = self.tools.refusal(req.language)
        if refusal:
            return RunCodeResponse.sandbox_error(refusal)
        slot = self._slots.get()
        scratch = None
        try:
            scratch = self._scratch(req, LANGUAGES[req.language], self.iso.uid(slot))
            return self._compile_and_run(req, LANGUAGES[req.language], scratch, self.iso.uid(slot))
        except OSError as e:
            return RunCodeResponse.sandbox_error(f"the sandbox could not run the submission: {e}")
        finally:
            if self.iso.uid(slot) is not None:
                isolation.kill_all(self.iso.uid(slot))
            if scratch is not None:
                shutil.rmtree(scratch, onerror=_force_remove)
            self._slots.put(slot)

    def _scratch(self, req: RunCodeRequest, lang: Language, uid: int | None) -> Path:
        scratch = Path(tempfile.mkdtemp(prefix="run-", dir=self.runs))
        (scratch / lang.source).write_text(req.code)
        for rel, content in req.files.items():
            path = scratch / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(base64.b64decode(content))
        if uid is not None:
            for path in [scratch, *scratch.rglob("*")]:
                os.chown(path, uid, uid)
        return scratch

    def _compile_and_run(self, req: RunCodeRequest, lang: Language, scratch: Path, uid: int | None) -> RunCodeResponse:
        mem = self.limits.memory_mb if req.memory_limit_MB <= 0 else min(req.memory_limit_MB, self.limits.memory_mb)
        compiled = None
        if lang.compile is not None:
            argv = self.tools.argv(lang.compile, max(mem, COMPILE_MEMORY_MB))
            cmd = _Command(
                argv, self._timeout(req.compile_timeout), max(mem, COMPILE_MEMORY_MB), lang.address_space, None
            )
            compiled = self._execute(cmd, scratch, uid, lang)
            if compiled.status != FINISHED or compiled.return_code != 0:
                return RunCodeResponse(FAILED, "compilation failed", compile_result=compiled)
        cmd = _Command(
            self.tools.argv(lang.run, mem), self._timeout(req.run_timeout), mem, lang.address_space, req.stdin
        )
        ran = self._execute(cmd, scratch, uid, lang)
        ok = ran.status == FINISHED and ran.return_code == 0
        files = _fetch(scratch, req.fetch_files)
        return RunCodeResponse(SUCCESS if ok else FAILED, "", compile_result=compiled, run_result=ran, files=files)

    def _timeout(self, asked: float) -> float:
        return min(asked, self.limits.timeout)

    def _rlimits(self, cmd: _Command, uid: int | None) -> dict[int, int]:
        nproc = self.limits.max_processes
        if uid is None:  # RLIMIT_NPROC counts every process of this user, the server's own among them
            nproc += len(isolation.processes_of(os.getuid()))
        out = {
            resource.RLIMIT_CPU: math.ceil(cmd.timeout) + 1,
            resource.RLIMIT_NPROC: nproc,
            resource.RLIMIT_FSIZE: self.limits.file_size_mb * MB,
            resource.RLIMIT_NOFILE: self.limits.open_files,
            resource.RLIMIT_CORE: 0,
        }
        if cmd.address_space:
            out[resource.RLIMIT_AS] = cmd.memory_mb * MB
        return out

    def _env(self, lang: Language) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        if self.iso.hook_dir and lang.run[0] == "{py}":
            env["PYTHONPATH"] = self.iso.hook_dir
        return env

    def _execute(self, cmd: _Command, scratch: Path, uid: int | None, lang: Language) -> CommandResult:
        """One command: started in its own session, waited for up to its timeout, then its process group and (as
        root) every process of its uid killed; TimeLimitExceeded where time ran out (wall clock or RLIMIT_CPU)."""
        limits = self._rlimits(cmd, uid)
        with tempfile.TemporaryFile(dir=self.io) as fin, tempfile.TemporaryFile(dir=self.io) as fout:
            with tempfile.TemporaryFile(dir=self.io) as ferr:
                fin.write((cmd.stdin or "").encode())
                fin.seek(0)
                start = time.monotonic()
                try:
                    proc = subprocess.Popen(
                        cmd.argv, cwd=scratch, stdin=fin, stdout=fout, stderr=ferr, env=self._env(lang),
                        start_new_session=True, preexec_fn=lambda: isolation.enter(self.iso, uid, limits),
                    )  # fmt: skip
                except (OSError, subprocess.SubprocessError) as e:
                    return CommandResult(ERROR, 0.0, None, "", f"could not start {cmd.argv[0]}: {e}")
                timed_out = _wait(proc, cmd.timeout)
                elapsed = time.monotonic() - start
                if uid is not None:
                    isolation.kill_all(uid)
                out, err = _read(fout), _read(ferr)
        if timed_out or proc.returncode == -signal.SIGXCPU:
            return CommandResult(TIME_LIMIT, elapsed, None, out, err)
        return CommandResult(FINISHED, elapsed, proc.returncode, out, err)


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    """Wait for the command; past the timeout kill its process group. True where time ran out."""
    try:
        proc.wait(timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its background children too, whether or not it exited
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    return timed_out


def _read(f) -> str:
    f.seek(0)
    return f.read().decode("utf-8", errors="replace")


def _fetch(scratch: Path, paths: list[str]) -> dict[str, str]:
    out = {}
    for rel in paths:
        path = (scratch / rel).resolve()
        if path.is_relative_to(scratch.resolve()) and path.is_file():
            out[rel] = base64.b64encode(path.read_bytes()).decode()
    return out


def _force_remove(func, path, _exc) -> None:
    # a submission may leave a directory without write or search permission for its owner
    os.chmod(os.path.dirname(path), 0o700)
    func(path)
