"""SandboxFusion's /run_code request and response (bytedance/SandboxFusion's public API), as plain dataclasses.

verl's client (verl/utils/reward_score/sandbox_fusion/utils.py) sends every request field below and reads
`status`, `compile_result` and `run_result` (status, execution_time, return_code, stdout, stderr)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict, dataclass, field

# the top-level status: everything ran and exited 0 / compile or run failed / the sandbox could not run it
SUCCESS, FAILED, SANDBOX_ERROR = "Success", "Failed", "SandboxError"
# one command's status: it exited (any code) / the wall-clock or CPU-time limit stopped it / it could not start
FINISHED, TIME_LIMIT, ERROR = "Finished", "TimeLimitExceeded", "Error"


class BadRequest(ValueError):
    """A request the protocol does not allow (HTTP 422, as SandboxFusion's validation error)."""


@dataclass
class RunCodeRequest:
    """One submission. Timeouts in seconds; memory_limit_MB <= 0 is the sandbox's own limit; files: relative
    path -> base64 content, written beside the code; fetch_files: relative paths read back after the run."""

    code: str
    language: str
    compile_timeout: float = 10.0
    run_timeout: float = 10.0
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    fetch_files: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, body: object) -> RunCodeRequest:
        """The request from a decoded JSON body; BadRequest naming the first field that is wrong."""
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object with code and language")
        for key, kind in (("code", str), ("language", str)):
            if not isinstance(body.get(key), kind):
                raise BadRequest(f"{key} must be a string")
        req = cls(code=body["code"], language=body["language"])
        for key in ("compile_timeout", "run_timeout"):
            value = body.get(key)
            if value is not None:
                if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                    raise BadRequest(f"{key} must be a positive number of seconds")
                setattr(req, key, float(value))
        mem = body.get("memory_limit_MB")
        if mem is not None:
            if not isinstance(mem, int) or isinstance(mem, bool):
                raise BadRequest("memory_limit_MB must be an integer (MB; -1: the sandbox's limit)")
            req.memory_limit_MB = mem
        if body.get("stdin") is not None and not isinstance(body["stdin"], str):
            raise BadRequest("stdin must be a string or null")
        req.stdin = body.get("stdin")
        req.files = _files(body.get("files") or {})
        fetch = body.get("fetch_files") or []
        if not isinstance(fetch, list) or not all(isinstance(p, str) for p in fetch):
            raise BadRequest("fetch_files must be a list of relative paths")
        req.fetch_files = [_relative(p) for p in fetch]
        return req


def _relative(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    if path.startswith("/") or ".." in parts or not path.strip("/"):
        raise BadRequest(f"file path {path!r} must be relative and stay in the submission's directory")
    return path


def _files(files: object) -> dict[str, str]:
    if not isinstance(files, dict):
        raise BadRequest("files must be an object of relative path -> base64 content")
    for path, content in files.items():
        _relative(path)
        try:
            base64.b64decode(content, validate=True)
        except (binascii.Error, TypeError) as e:
            raise BadRequest(f"files[{path!r}] is not base64: {e}") from None
    return dict(files)


@dataclass
class CommandResult:
    """One command (compile or run). return_code is None when it did not exit by itself (a time limit, or it
    never started); a negative code is the signal that ended it (e.g. -9 SIGKILL, -25 SIGXFSZ)."""

    status: str
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


@dataclass
class RunCodeResponse:
    """The answer to one submission, sent as JSON with HTTP 200 whatever the submission did."""

    status: str
    message: str = ""
    compile_result: CommandResult | None = None
    run_result: CommandResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def sandbox_error(cls, message: str) -> RunCodeResponse:
        return cls(status=SANDBOX_ERROR, message=message)
