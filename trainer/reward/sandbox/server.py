"""The HTTP face of `rlrig sandbox`: SandboxFusion's POST /run_code (and its GET /v1/ping), one thread per
connection, the Runner's slots bounding how many submissions run at once."""

from __future__ import annotations

import json
import logging
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .protocol import BadRequest, RunCodeRequest, RunCodeResponse
from .runner import Runner

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024 * 1024  # a request's code, stdin and files together


class SandboxServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that hands each /run_code body to `runner` (requests past its concurrency wait)."""

    daemon_threads = True
    request_queue_size = 256  # verl's client sends up to reward.sandbox_fusion.max_concurrent requests at once

    def __init__(self, address: tuple[str, int], runner: Runner, work_dir: Path):
        self.runner, self.work_dir = runner, work_dir  # work_dir: the scratch directories' parent, removed at the end
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/run_code"


class _Handler(BaseHTTPRequestHandler):
    server: SandboxServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self):
        if self.path.rstrip("/") in ("/v1/ping", ""):
            self._send(200, "pong", "text/plain")
        else:
            self._send(404, json.dumps({"detail": "Not Found"}))

    def do_POST(self):
        if self.path.rstrip("/") != "/run_code":
            return self._send(404, json.dumps({"detail": f"no {self.path}: rlrig sandbox serves POST /run_code"}))
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            return self._send(400, json.dumps({"detail": "Content-Length must be a whole number of bytes"}))
        if length > MAX_BODY:
            return self._send(413, json.dumps({"detail": f"request body over {MAX_BODY // 2**20} MB"}))
        try:
            req = RunCodeRequest.parse(json.loads(self.rfile.read(length) or b"null"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return self._send(422, json.dumps({"detail": f"the body is not JSON: {e}"}))
        except BadRequest as e:
            return self._send(422, json.dumps({"detail": str(e)}))
        try:
            resp = self.server.runner.run(req)
        except Exception as e:  # the service outlives any one submission
            log.exception("submission failed inside the sandbox")
            resp = RunCodeResponse.sandbox_error(f"{type(e).__name__}: {e}")
        resp.executor_pod_name = socket.gethostname()
        self._send(200, json.dumps(resp.to_dict()))

    def _send(self, code: int, body: str, kind: str = "application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
