"""An engine in a child process of its own, spoken to over a pipe: the reward model's vLLM scorer, the vLLM
distillation teacher, the generative judge's server. A child has its own CUDA context and allocator (two vLLM
engines in one process would share its sleep-mode allocator), and dies with its parent (PR_SET_PDEATHSIG), so no
engine outlives a worker.

Contract: the child's target takes its end of the pipe first, sends ("ready", value) or ("error", why) once it is
up, then answers each message with one (kind, value) until the pipe closes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os

from .devices import own_gpu_only


def child_env(device: str, visible: dict | None = None) -> dict:
    """The environment of an engine's child process: the child is the engine's own process (no vLLM subprocess of
    its own), on its worker's GPU only, or on the GPUs `visible` names (devices.showing, own_gpus_only: an engine
    over several GPUs, whose tensor-parallel processes vLLM starts); on CPU a small KV cache and no thread pinning,
    unless the user set them."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if device == "cuda":
        env.update(own_gpu_only() if visible is None else visible)
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


def serve_vllm(conn, kw: dict, sleeps: bool, env: dict, install_hint: str, answer) -> None:
    """A child holding one vllm.LLM(**kw): asleep between messages where `sleeps`; each (kind, token lists, *more)
    is answered with answer(vllm, llm, token lists, *more) -> (kind, value), until the parent closes the pipe.
    `answer` is a module-level function (it crosses to the spawned child by name)."""
    die_with_parent()
    os.environ.update(env)
    try:
        import vllm

        llm = vllm.LLM(**kw)
        if sleeps:
            llm.sleep(level=1)
    except ImportError as e:
        conn.send(("error", f"vLLM is not installed ({e}); {install_hint}"))
        return
    except Exception as e:  # noqa: BLE001 - the parent reports it as the reason the engine did not start
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    segments = engine_segments()
    conn.send(("ready", None))
    try:
        while True:
            try:
                _, seqs, *more = conn.recv()
            except EOFError:  # the parent is gone
                return
            try:
                if sleeps:
                    llm.wake_up()
                out = answer(vllm, llm, seqs, *more)
                if sleeps:
                    llm.sleep(level=1)
            except Exception as e:  # noqa: BLE001 - sent to the parent, which raises it in the step
                conn.send(("error", f"{type(e).__name__}: {e}"))
                return
            conn.send(out)
    finally:
        shut_down_vllm(llm, segments)


def engine_segments() -> set[str]:
    """The shared memory of the engine's tensor-parallel group on CPU (vLLM's `*cpushm*` files in /dev/shm), read once
    the engine is up from what this process's descendants, its worker processes, map."""
    import psutil

    found = set()
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/maps") as maps:
            found.update(line.split(maxsplit=5)[5].strip() for line in maps if "/dev/shm/" in line and "cpushm" in line)
    return found


def shut_down_vllm(llm, segments: set[str]) -> None:
    """Ends a vllm.LLM's engine (in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0) and the worker processes vLLM
    started for it, before this process ends (left to the interpreter's exit, the workers go first and vLLM's monitor
    logs an error about them for a clean close); then unlinks what of the engine's `segments` (engine_segments) is
    still there. vLLM's workers unlink them only when they exit within its grace period
    (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS); one killed after it (a loaded machine, a run failing while the engine
    starts) leaves them for good, hundreds of MB each."""
    llm.llm_engine.engine_core.shutdown()
    for path in segments:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def quiet_resource_tracker() -> None:
    """Starts this process's multiprocessing resource tracker, where none runs yet, without its warning about what it
    unlinks. The children share it (spawn hands it down), and vLLM leaves the message queues of its worker processes
    for it to unlink by design (process_exit.end_resource_tracker waits for that): a warning of "leaked
    shared_memory objects" at the end of every run would say that something went wrong when nothing did."""
    from multiprocessing import resource_tracker

    # the tracker is a new interpreter that reads the warning filters from its environment as it starts
    was = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [was, "ignore::UserWarning:multiprocessing.resource_tracker"]))
    try:
        resource_tracker.ensure_running()
    finally:
        if was is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = was


class Child:
    """The parent's side: the child started (spawned: never fork a process that holds CUDA or torch threads) with
    `target(its_pipe_end, *args)`; recv() is its next message, or ("error", why) where it exited."""

    def __init__(self, target, args: tuple, name: str):
        quiet_resource_tracker()
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
