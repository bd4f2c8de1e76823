"""`rlrig sandbox`: serve SandboxFusion's /run_code on this machine until interrupted."""

from __future__ import annotations

import os
import shutil
import signal
import sys

DEFAULTS = {"host": "127.0.0.1", "port": 8080, "max_concurrency": 4, "memory_limit_mb": 1024, "timeout": 30.0}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sandbox",
        help="serve SandboxFusion's /run_code here: each submission in its own process, scratch directory and "
        "(where the machine allows) network namespace and uid, under memory, time, process and file-size limits",
    )
    p.add_argument("--host", default=DEFAULTS["host"], help="address to listen on")
    p.add_argument("--port", type=int, default=DEFAULTS["port"], help="0: any free port")
    p.add_argument(
        "--max-concurrency", type=int, default=DEFAULTS["max_concurrency"], help="submissions run at once; more wait"
    )
    p.add_argument(
        "--memory-limit-mb",
        type=int,
        default=DEFAULTS["memory_limit_mb"],
        help="address-space limit of each process; a request's memory_limit_MB is taken up to it",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULTS["timeout"],
        help="the longest compile or run in seconds; a request's compile/run_timeout is taken up to it",
    )
    p.set_defaults(func=cmd_sandbox)


def start(host: str, port: int, max_concurrency: int, memory_limit_mb: int, timeout: float):
    """A SandboxServer bound and ready (serve_forever not yet called), its isolation chosen for this machine."""
    from . import isolation
    from .languages import Toolchain
    from .runner import Limits, Runner
    from .server import SandboxServer

    if max_concurrency < 1 or memory_limit_mb < 16 or timeout <= 0:
        raise ValueError("--max-concurrency must be >= 1, --memory-limit-mb >= 16 and --timeout > 0")
    work = isolation.work_dir(root=os.geteuid() == 0)
    iso = isolation.detect(work)
    runner = Runner(Limits(memory_limit_mb, timeout), max_concurrency, work, iso, Toolchain.detect(iso.own_uid))
    return SandboxServer((host, port), runner, work)


def _exit(*_):
    raise SystemExit(0)


def cmd_sandbox(args) -> int:
    try:
        server = start(args.host, args.port, args.max_concurrency, args.memory_limit_mb, args.timeout)
    except (ValueError, OSError) as e:
        print(f"rlrig: error: sandbox: {e}", file=sys.stderr)
        return 2
    r = server.runner
    print(f"rlrig sandbox: {server.url} (SandboxFusion's /run_code), {args.max_concurrency} at once", flush=True)
    print(f"rlrig sandbox: {r.iso.describe()}", flush=True)
    print(
        f"rlrig sandbox: limits per process: {r.limits.memory_mb} MB address space, {r.limits.timeout:g} s wall "
        f"clock, {r.limits.max_processes} processes, {r.limits.file_size_mb} MB per file",
        flush=True,
    )
    print(f"rlrig sandbox: languages: {', '.join(r.tools.available())}", flush=True)
    # SIGTERM (how a training run stops the sandbox it started) ends it as Ctrl-C does, its scratch removed
    signal.signal(signal.SIGTERM, _exit)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        shutil.rmtree(server.work_dir, ignore_errors=True)
    return 0
