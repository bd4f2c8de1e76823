"""`reward_model.sandbox_fusion.url=local`: `rlrig sandbox` started on the driver's node for the length of a run,
its URL put in the run's config in place of `local`, stopped when the run ends."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ...errors import ConfigError

LOCAL = "local"


def _host(cfg) -> str:
    """Loopback where every worker is on this node; else this node's address, which the other nodes reach."""
    pools = [cfg.trainer, cfg.rollout, *cfg.own_pools().values()]
    if all(p.nnodes <= 1 for p in pools):
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address()


def _relay(stream) -> None:
    for line in stream:
        print(line, end="", flush=True)


@contextmanager
def beside_run(cfg) -> Iterator:
    """The config the run uses: `cfg` itself, or with url=local a copy naming the sandbox started here (its
    concurrency this node's CPU count; its memory ceiling the key's memory_limit_mb). The sandbox's start-up
    lines go to the run's output; a sandbox that cannot start is a ConfigError with its own last line."""
    sf = cfg.reward_model.sandbox_fusion
    if sf.url != LOCAL:
        yield cfg
        return
    argv = [sys.executable, "-m", "rlrig.entrypoint.cli", "sandbox", "--host", _host(cfg), "--port", "0"]
    argv += ["--max-concurrency", str(os.cpu_count() or 1), "--memory-limit-mb", str(sf.memory_limit_mb or 1024)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = proc.stdout.readline()
    if not first.startswith("rlrig sandbox: http"):
        rest = (first + proc.stdout.read()).strip().splitlines()
        proc.wait()
        raise ConfigError(
            f"reward_model.sandbox_fusion.url=local: rlrig sandbox did not start: {rest[-1] if rest else 'no output'}"
        )
    print(first, end="", flush=True)
    threading.Thread(target=_relay, args=(proc.stdout,), daemon=True).start()
    run_cfg = copy.deepcopy(cfg)
    run_cfg.reward_model.sandbox_fusion.url = first.split()[2]
    try:
        yield run_cfg
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
