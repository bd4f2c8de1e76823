"""An engine in a child process of its own, spoken to over a pipe: the reward model's vLLM scorer, the vLLM
distillation teacher, the generative judge's server. A child has its own CUDA context and allocator (two vLLM
engines in one process would share its sleep-mode allocator), and dies with its parent (PR_SET_PDEATHSIG), so no
engine outlives a worker.

Contract: the child's target takes its end of the pipe first, sends ("ready", value) or ("error", why) once it is
up, then answers each message with one (kind, value) until the pipe closes.
"""

from __future__ import annotations

import multiprocessing as mp
import os

from .devices import own_gpu_only


def child_env(device: str) -> dict:
    """The environment of an engine's child process: the child is the engine's own process (no vLLM subprocess of
    its own), on its worker's GPU only; on CPU a small KV cache and no thread pinning, unless the user set them."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if device == "cuda":
        env.update(own_gpu_only())
    else:
        env.update(
            VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
        )
    return env


def die_with_parent() -> None:
    """In the child, first: it is killed when its parent dies."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Child:
    """The parent's side: the child started (spawned: never fork a process that holds CUDA or torch threads) with
    `target(its_pipe_end, *args)`; recv() is its next message, or ("error", why) where it exited."""

    def __init__(self, target, args: tuple, name: str):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, *args), name=name)
        self.proc.start()
        child.close()

    def recv(self) -> tuple[str, object]:
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(5)
            return "error", f"its process exited with code {self.proc.exitcode}"

    def ask(self, message) -> tuple[str, object]:
        self.conn.send(message)
        return self.recv()

    def close(self) -> None:
        """Ends the child: it exits when the pipe closes, and is killed after 30 s."""
        self.conn.close()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
