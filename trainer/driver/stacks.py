"""Every worker's Python stack, read on its own node: py-spy where it is installed and may read the process
(ray[default] installs it; a container needs ptrace), else the worker's own faulthandler dump on a signal
(workers/phase_report.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# frames of a rank waiting for its peers in a collective (Gloo blocks in the call; DDP's gradient all-reduce runs
# under backward). On GPUs an NCCL wait shows as a CUDA sync instead, and no rank is told apart this way.
COLLECTIVE_FRAMES = ("torch/distributed/", "torch/nn/parallel/distributed.py", "torch/autograd/")
ANSWER_S = 40.0  # how long the head waits for the nodes' dumps: a node that does not answer is named as such


@dataclass(frozen=True)
class Proc:
    """A worker process: its label in the run (`rank 1`, `critic 0`) and where it is."""

    label: str
    node_id: str
    ip: str
    pid: int


def in_collective(stack: str) -> bool:
    return any(frame in stack for frame in COLLECTIVE_FRAMES)


def py_spy() -> str | None:
    """py-spy on PATH, or beside this Python (a venv's bin is not on a Ray worker's PATH)."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return shutil.which("py-spy") or (beside if os.access(beside, os.X_OK) else None)


def python_stack(pid: int, wait_s: float = 5.0) -> str:
    """Process `pid`'s threads' Python stacks, with the tool that read them on the first line. Runs on the
    process's node."""
    from ..workers.phase_report import STACK_SIGNAL, stack_file

    why = "py-spy is not installed"
    tool = py_spy()
    if tool:
        try:
            r = subprocess.run([tool, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
            if r.returncode == 0 and r.stdout.strip():
                return "py-spy dump:\n" + r.stdout
            said = (r.stderr or r.stdout).strip().splitlines()
            why = f"py-spy failed: {said[-1] if said else f'exit {r.returncode}'}"
        except subprocess.TimeoutExpired:
            why = "py-spy did not answer within 20 s"
    path = stack_file(pid)
    if not os.path.exists(path):
        return f"no stack: {why}, and the process has no faulthandler dump ({path})"
    before = os.path.getsize(path)
    os.kill(pid, STACK_SIGNAL)
    end, size = time.monotonic() + wait_s, before
    while time.monotonic() < end:  # the handler writes in pieces: read once the file stops growing
        time.sleep(0.3)
        now = os.path.getsize(path)
        if now > before and now == size:
            break
        size = now
    with open(path) as f:
        f.seek(before)
        return f"faulthandler ({why}):\n" + f.read()


def dump(procs: list[Proc], folder: Path) -> dict[str, str]:
    """Each worker's stack, read on its node at once, written to folder/<label>.txt; by label."""
    import ray
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(python_stack)
    refs = {
        # no CPU asked: the workers hold every CPU of their nodes' bundles
        p.label: task.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(p.node_id, soft=False)
        ).remote(p.pid)
        for p in procs
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=ANSWER_S)
    folder.mkdir(parents=True, exist_ok=True)
    stacks = {}
    for p in procs:
        ref = refs[p.label]
        try:
            text = ray.get(ref) if ref in ready else f"no stack: node {p.ip} did not answer within {ANSWER_S:g} s"
        except RayError as e:  # the node's task failed (the node went away): say so in the file
            text = f"no stack: reading it on {p.ip} failed: {e}"
        stacks[p.label] = text
        (folder / f"{p.label.replace(' ', '-')}.txt").write_text(f"{p.label} on {p.ip}, pid {p.pid}\n{text}")
    return stacks
