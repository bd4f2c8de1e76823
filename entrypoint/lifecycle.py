"""start / wait / run / stop, on every node. Linear on purpose: read it top to bottom.

Head:   ray start --head -> publish env -> wait for nnodes -> compare versions -> run CMD while
        watching nodes -> publish exit code -> stop.
Worker: wait for the head's GCS -> read env -> ray start --address -> wait for the head's exit
        code (or notice the head is gone) -> stop.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Mapping

from . import coordination, raystart
from .addresses import format_hostport
from .errors import RigError
from .nodespec import NodeSpec
from .preflight import Preflight
from .processes import Stop, install_stop_handlers, sleep_until, sweep_descendants, terminate_group

POLL = 0.2


def say(msg: str) -> None:
    print(f"rlrig: {msg}", file=sys.stderr, flush=True)


@dataclass
class Options:
    wait_timeout: float = 300.0  # head: for all nodes to join; worker: for the head to come up
    head_loss_timeout: float = 30.0  # worker: GCS unreachable this long = head lost
    dashboard_host: str = "127.0.0.1"


class NodeLost(RigError):
    exit_code = 3


def _ray_died(proc: subprocess.Popen, what: str) -> RigError:
    return RigError(f"{what}: `ray start` exited with code {proc.returncode}; see its output above")


def _connect_kv(address: str, proc: subprocess.Popen | None, deadline: float, what: str) -> coordination.Kv:
    """Poll until the GCS answers. Authentication errors are final; connection errors are retried."""
    from ray.exceptions import AuthenticationError

    host, port = address.rsplit(":", 1)
    while True:
        if proc is not None and proc.poll() is not None:
            raise _ray_died(proc, what)
        if _port_open(host.strip("[]"), int(port)):
            try:
                return coordination.Kv(address)
            except AuthenticationError:
                raise RigError(f"the head at {address} refused this node's token; set the same RLRIG_CLUSTER_TOKEN on every node") from None
            except Exception:
                pass
        if time.monotonic() > deadline:
            raise RigError(f"{what}: no Ray head answered at {address} in time; check that rank 0 is running and the port is open")
        sleep_until(deadline, POLL)


def _port_open(host: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def wait_for_nodes(kv: coordination.Kv, spec: NodeSpec, proc: subprocess.Popen, deadline: float) -> dict[int, dict]:
    while True:
        if proc.poll() is not None:
            raise _ray_died(proc, "head")
        nodes = {r: n for r, n in kv.nodes().items() if n["alive"]}
        if len(nodes) >= spec.nnodes:
            return nodes
        if time.monotonic() > deadline:
            missing = sorted(set(range(spec.nnodes)) - set(nodes))
            facts = kv.facts()
            detail = []
            for r in missing:
                f = facts.get(r)
                detail.append(f"{r} (reached the head from {f['ip']} but its raylet did not join)" if f else str(r))
            mism = coordination.version_mismatches(facts)
            raise RigError(
                f"{len(nodes)}/{spec.nnodes} nodes joined before the timeout; missing rank(s): {', '.join(detail)}"
                + (f"; {'; '.join(mism)}" if mism else "") + "; check those nodes' logs or raise --timeout"
            )
        time.sleep(POLL)


def run_command(cmd: list[str], env: Mapping[str, str], kv: coordination.Kv, spec: NodeSpec, ray_proc: subprocess.Popen) -> int:
    """Run CMD; stop it if a node dies. Returns CMD's exit code."""
    child = subprocess.Popen(cmd, env=dict(env), start_new_session=True)
    try:
        next_check = time.monotonic() + 1.0
        while child.poll() is None:
            time.sleep(POLL)
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + 1.0
            if ray_proc.poll() is not None:
                raise NodeLost("the head's Ray processes died while the command ran; see the Ray logs in the temp dir")
            lost = [f"rank {r} ({n['ip']})" for r, n in sorted(kv.nodes().items()) if not n["alive"]]
            if lost:
                raise NodeLost(f"lost node {', '.join(lost)} while the command ran; stopped the command")
        return child.returncode
    finally:
        terminate_group(child)


def _publish_exit(kv: coordination.Kv, code: int, nnodes: int, wait: float = 10.0) -> None:
    """Tell the workers how the job ended and give them a moment to read it before the GCS goes."""
    try:
        kv.put("exit", code)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            alive = {r for r, n in kv.nodes().items() if n["alive"] and r != 0}
            acked = {r for r in alive if kv.get(f"ack/{r}") is not None}
            if acked >= alive:
                return
            time.sleep(POLL)
    except Exception:
        pass  # the GCS is already gone; workers will notice the head is lost


def run_head(spec: NodeSpec, pf: Preflight, cmd: list[str], ray_env: dict[str, str], cluster: dict[str, str], opts: Options) -> int:
    address = format_hostport(spec.node_ip, spec.port)
    temp = ray_env["RAY_TMPDIR"]
    say(f"head of {spec.nnodes} node(s) at {address} ({spec.launcher}), {pf.num_cpus} CPU, {pf.num_gpus} GPU, temp {temp}")
    ray_proc = subprocess.Popen(raystart.start_command(spec, pf, temp, opts.dashboard_host), env=ray_env,
                                stdout=subprocess.DEVNULL, start_new_session=True)
    kv = None
    code = 1
    t0 = time.monotonic()
    try:
        deadline = t0 + opts.wait_timeout
        kv = _connect_kv(address, ray_proc, deadline, "head")
        kv.put("env", cluster)
        kv.put("node/0", coordination.node_facts(0, spec.node_ip, pf.num_gpus))
        nodes = wait_for_nodes(kv, spec, ray_proc, deadline)
        mism = coordination.version_mismatches(kv.facts())
        if mism:
            raise RigError("nodes differ: " + "; ".join(mism) + "; install the same versions on every node (one image)")
        say(f"{len(nodes)} node(s) alive after {time.monotonic() - t0:.1f}s; running: {' '.join(cmd)}")
        cmd_env = {**ray_env, "RAY_ADDRESS": address}
        code = run_command(cmd, cmd_env, kv, spec, ray_proc)
        say(f"command exited with code {code}")
        return code
    except Stop as s:
        code = s.code
        raise
    except RigError as e:
        code = e.exit_code
        raise
    finally:
        if kv is not None:
            _publish_exit(kv, code, spec.nnodes)
        terminate_group(ray_proc)
        sweep_descendants()


def run_worker(spec: NodeSpec, pf: Preflight, ray_env: dict[str, str], opts: Options) -> int:
    address = format_hostport(spec.head_address, spec.port)
    say(f"worker rank {spec.node_rank}/{spec.nnodes} at {spec.node_ip} joining {address} ({spec.launcher})")
    deadline = time.monotonic() + opts.wait_timeout
    kv = _connect_kv(address, None, deadline, f"worker {spec.node_rank}")
    cluster = None
    while cluster is None:  # the head publishes it right after its GCS comes up
        cluster = kv.get("env")
        if cluster is None:
            if time.monotonic() > deadline:
                raise RigError(f"the head at {address} never published the cluster environment; is it an rlrig head?")
            time.sleep(POLL)
    kv.put(f"node/{spec.node_rank}", coordination.node_facts(spec.node_rank, spec.node_ip, pf.num_gpus))
    env = {**ray_env, **cluster, **pf.env_updates}
    ray_proc = subprocess.Popen(raystart.start_command(spec, pf, ray_env["RAY_TMPDIR"], opts.dashboard_host), env=env,
                                stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        last_ok = time.monotonic()
        while True:
            if ray_proc.poll() is not None:
                raise NodeLost(f"this node's Ray exited with code {ray_proc.returncode} (head gone or node evicted)")
            try:
                code = kv.get("exit", timeout=2)
                last_ok = time.monotonic()
            except Exception:
                code = None
                if time.monotonic() - last_ok > opts.head_loss_timeout:
                    raise NodeLost(f"lost the head {address}: no answer for {opts.head_loss_timeout:.0f}s")
            if code is not None:
                try:
                    kv.put(f"ack/{spec.node_rank}", True)
                except Exception:
                    pass  # the head did not wait for us; nothing is lost
                say(f"head finished with code {code}; stopping")
                return int(code)
            time.sleep(0.5)
    finally:
        terminate_group(ray_proc)
        sweep_descendants()


def run_existing(address: str, cmd: list[str], env: Mapping[str, str]) -> int:
    say(f"Ray already runs here ({address}); starting nothing")
    child = subprocess.Popen(cmd, env={**env, "RAY_ADDRESS": address} if address != "auto" else dict(env), start_new_session=True)
    try:
        return child.wait()
    finally:
        terminate_group(child)


def main(spec: NodeSpec, pf: Preflight, cmd: list[str], ray_env: dict[str, str], cluster: dict[str, str], opts: Options) -> int:
    install_stop_handlers()
    from .processes import become_subreaper

    # Our own GCS client reads the token from this process's environment.
    os.environ.update({k: ray_env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN") if k in ray_env})

    become_subreaper()
    try:
        if spec.is_head:
            return run_head(spec, pf, cmd, ray_env, cluster, opts)
        return run_worker(spec, pf, ray_env, opts)
    except Stop as s:
        say(f"stopped by {s}; everything rlrig started is stopped")
        return s.code
