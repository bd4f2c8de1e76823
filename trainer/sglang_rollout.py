"""SGLang as the rollout engine (GPU only; written against SGLang's offline Engine API, not run here).

Weights reach the engine with `update_weights_from_tensor` (CUDA IPC handles, no disk); between
rollouts `release_memory_occupation` hands its memory back to training when free_cache_engine is on.
"""

from __future__ import annotations

from .rollout import EngineUnavailable, RolloutEngine, pack_responses

INSTALL_HINT = "pip install 'rlrig[sglang]' on a CUDA machine"


def engine_kwargs(cfg, model_path: str, max_model_len: int, seed: int) -> dict:
    dtype = "bfloat16" if cfg.dtype == "auto" else cfg.dtype
    return dict(model_path=model_path, skip_tokenizer_init=True, dtype=dtype, random_seed=seed,
                tp_size=cfg.tensor_model_parallel_size, mem_fraction_static=cfg.gpu_memory_utilization,
                context_length=max_model_len, enable_memory_saver=cfg.free_cache_engine,
                disable_cuda_graph=cfg.enforce_eager, log_level="error")


def sampling_params(cfg, greedy: bool, max_new: int, eos_id: int) -> dict:
    return {"temperature": 0.0 if greedy else cfg.temperature, "top_p": 1.0 if greedy else cfg.top_p,
            "max_new_tokens": max_new, "stop_token_ids": [eos_id], "skip_special_tokens": False}


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

    def __init__(self, model_path, tokenizer, cfg, max_response_length, max_prompt_length, device, seed):
        if device != "cuda":
            raise EngineUnavailable("actor_rollout_ref.rollout.name=sglang needs CUDA GPUs; use vllm or hf on CPU")
        try:
            import sglang
        except ImportError as e:
            raise EngineUnavailable(f"SGLang is not installed ({e}); {INSTALL_HINT}") from None
        self.tok, self.cfg, self.max_new = tokenizer, cfg, max_response_length
        self.engine = sglang.Engine(**engine_kwargs(cfg, model_path, max_prompt_length + max_response_length, seed))
        self.released = False

    def generate(self, prompts, n, greedy=False):
        if self.released:
            self.engine.resume_memory_occupation()
            self.released = False
        expanded = [p for p in prompts for _ in range(n)]  # sample i*n..i*n+n-1 belong to prompt i
        outs = self.engine.generate(input_ids=expanded, return_logprob=True,
                                    sampling_params=sampling_params(self.cfg, greedy, self.max_new, self.tok.eos_token_id))
        tokens, logps = unpack(outs)
        if self.cfg.free_cache_engine:
            self.engine.release_memory_occupation()
            self.released = True
        return pack_responses(prompts, n, tokens, logps, self.max_new, self.tok.pad_token_id, self.tok.eos_token_id)

    def sync_weights(self, weights) -> None:
        if self.released:
            self.engine.resume_memory_occupation()
            self.released = False
        self.engine.update_weights_from_tensor(named_tensors=list(weights), flush_cache=True)
