"""SGLang as the rollout engine (GPU only; written against SGLang's offline Engine API, not run here).

Weights reach the engine with `update_weights_from_tensor` (CUDA IPC handles, no disk), in buckets of
at most BUCKET_BYTES in the engine's dtype, so the whole model is never materialised twice on the GPU.
Between rollouts `release_memory_occupation(tags=["kv_cache"])` hands the KV cache back to training when
free_cache_engine is on. The weights stay: released without tags they are dropped with no CPU copy,
and a rollout after a validation pass (no weight sync in between) would generate from garbage.
"""

from __future__ import annotations

import torch

from .base import EngineContext, EngineNotInstalled, RolloutEngine, Sampling, pack_responses

INSTALL_HINT = "pip install 'rlrig[sglang]' on a CUDA machine"
BUCKET_BYTES = 512 * 2**20
KV = ["kv_cache"]


def buckets(weights, dtype, limit: int = BUCKET_BYTES):
    """(name, tensor) pairs cast to the engine's dtype, grouped into lists of at most `limit` bytes
    (a tensor larger than the limit goes alone)."""
    out, size = [], 0
    for name, t in weights:
        t = t.to(dtype) if dtype is not None else t
        nbytes = t.numel() * t.element_size()
        if out and size + nbytes > limit:
            yield out
            out, size = [], 0
        out.append((name, t))
        size += nbytes
    if out:
        yield out


def engine_dtype(cfg) -> str:
    return "bfloat16" if cfg.dtype == "auto" else cfg.dtype


def engine_kwargs(cfg, model_path: str, max_model_len: int, seed: int) -> dict:
    kw = dict(model_path=model_path, skip_tokenizer_init=True, dtype=engine_dtype(cfg), random_seed=seed,
              tp_size=cfg.tensor_model_parallel_size, mem_fraction_static=cfg.gpu_memory_utilization,
              context_length=cfg.max_model_len or max_model_len, enable_memory_saver=cfg.free_cache_engine,
              load_format=cfg.load_format, disable_cuda_graph=cfg.enforce_eager, log_level="error")
    return {**kw, **cfg.engine_kwargs.get("sglang", {})}  # rollout.engine_kwargs.sglang.*: the user's word is last


def sampling_params(s: Sampling, max_new: int, eos_id: int) -> dict:
    # do_sample=False (or temperature 0) decodes greedily, as verl does
    out = {"temperature": 0.0 if s.greedy else s.temperature, "top_p": 1.0 if s.greedy else s.top_p,
           "max_new_tokens": max_new, "stop_token_ids": [eos_id], "skip_special_tokens": False}
    if s.top_k > 0 and not s.greedy:
        out["top_k"] = s.top_k
    return out


def unpack(outputs: list[dict]) -> tuple[list[list[int]], list[list[float]]]:
    """Token ids and their log-probs from Engine.generate(..., return_logprob=True) results;
    meta_info.output_token_logprobs holds (logprob, token_id, text) per generated token."""
    tokens, logps = [], []
    for o in outputs:
        tokens.append(list(o["output_ids"]))
        logps.append([float(t[0]) for t in o["meta_info"]["output_token_logprobs"]])
    return tokens, logps


class SGLangRollout(RolloutEngine):
    name = "sglang"
    devices = ("cuda",)

    def __init__(self, ctx: EngineContext):
        try:
            import sglang
        except ImportError as e:
            raise EngineNotInstalled(f"SGLang is not installed ({e}); {INSTALL_HINT}") from None
        self.tok, self.cfg, self.max_new = ctx.tokenizer, ctx.cfg, ctx.max_response_length
        self.engine = sglang.Engine(**engine_kwargs(ctx.cfg, ctx.model_path, ctx.max_prompt_length + ctx.max_response_length, ctx.seed))
        self.released = False
        self.dtype = getattr(torch, engine_dtype(ctx.cfg))  # what the engine holds its weights in

    def _resume_kv(self):
        if self.released:
            self.engine.resume_memory_occupation(tags=KV)
            self.released = False

    def generate(self, prompts, n, sampling=None):
        self._resume_kv()
        expanded = [p for p in prompts for _ in range(n)]  # sample i*n..i*n+n-1 belong to prompt i
        outs = self.engine.generate(input_ids=expanded, return_logprob=True,
                                    sampling_params=sampling_params(sampling or Sampling.of(self.cfg), self.max_new, self.tok.eos_token_id))
        tokens, logps = unpack(outs)
        if self.cfg.free_cache_engine:
            self.engine.release_memory_occupation(tags=KV)
            self.released = True
        return pack_responses(prompts, n, tokens, logps, self.max_new, self.tok.pad_token_id, self.tok.eos_token_id)

    def sync_weights(self, weights) -> None:
        # the weights are resident (only the KV cache is ever released); the cache is flushed once, at the end
        for chunk in buckets(weights, self.dtype):
            self.engine.update_weights_from_tensor(named_tensors=chunk, flush_cache=False)
        self.engine.flush_cache()
