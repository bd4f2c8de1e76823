"""The engines a generative judge (reward/judge_server.py) generates with, chosen by reward_model.rollout.name:
`hf` (transformers' generate), `vllm` (vllm.LLM) and `sglang` (sglang.Engine, GPU only).

Contract of an engine: built in the judge server's own process from a JudgeSpec; `generate(requests)` answers a
batch of JudgeRequests in order, each with its own sampling, with one JudgeOutput each; `sleep()` frees the device
between scorings where the spec asks for it (free_cache_engine on a GPU) and `wake()` takes it back; `close()`
releases what it holds. An engine raises JudgeEngineError (with the fix) where it cannot start. One registration:
ENGINES below.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from rlrig.entrypoint.cluster.ports import kernel_free_port

from ..child_process import engine_segments, shut_down_vllm
from ..rollout.engines.sglang_engine import INSTALL_HINT as SGLANG_INSTALL
from .vllm_scorer import INSTALL_HINT as VLLM_INSTALL


class JudgeEngineError(RuntimeError):
    """The judge's engine cannot start here; the message says why and how to fix it."""


@dataclass(frozen=True)
class JudgeSpec:
    """What a judge engine is built from: reward_model.rollout.* as a dict, the judge's directory and device."""

    path: str
    device: str  # cpu | cuda
    rollout: dict  # reward_model.rollout.* (name, dtype, gpu_memory_utilization, max_num_seqs, ...)
    max_model_len: int
    trust_remote_code: bool = False

    @property
    def dtype(self) -> str:
        d = self.rollout["dtype"]
        return d if d != "auto" else ("bfloat16" if self.device == "cuda" else "float32")

    @property
    def sleeps(self) -> bool:
        """Whether the engine frees the device between scorings (a colocated judge on a GPU)."""
        return self.device == "cuda" and self.rollout["free_cache_engine"]


@dataclass(frozen=True)
class JudgeRequest:
    """One completion to generate: the prompt's tokens and the request's own sampling."""

    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k truncation
    seed: int | None = None

    def sampling(self) -> tuple:
        return (self.temperature, self.top_p, self.top_k, self.seed)


@dataclass(frozen=True)
class JudgeOutput:
    ids: list[int]
    finish_reason: str  # stop (an end token) | length (max_tokens)


class JudgeEngine:
    """See the module's docstring."""

    name = "?"

    def __init__(self, spec: JudgeSpec):
        raise NotImplementedError

    def generate(self, requests: list[JudgeRequest]) -> list[JudgeOutput]:
        raise NotImplementedError

    def sleep(self) -> None:
        """Free the device until wake() (a no-op where the spec does not sleep)."""

    def wake(self) -> None:
        """Take the device back after sleep()."""

    def close(self) -> None:
        """Release what the engine holds beyond this object."""


class HFJudge(JudgeEngine):
    """transformers' generate; requests of the same sampling are generated together, left-padded."""

    name = "hf"

    def __init__(self, spec: JudgeSpec):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        trust = {"trust_remote_code": True} if spec.trust_remote_code else {}
        self.spec, self.device = spec, torch.device(spec.device)
        self.tok = AutoTokenizer.from_pretrained(spec.path, **trust)
        self.model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=getattr(torch, spec.dtype), **trust)
        self.model.eval().requires_grad_(False).to(self.device)
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos]) - {None} or {self.tok.eos_token_id}
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else next(iter(self.eos))
        self.sleep()

    @torch.no_grad()
    def generate(self, requests: list[JudgeRequest]) -> list[JudgeOutput]:
        out: list[JudgeOutput | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: requests[i].sampling())
        for sampling, group in itertools.groupby(order, key=lambda i: requests[i].sampling()):
            rows = list(group)
            for i, o in zip(rows, self._generate([requests[i] for i in rows], *sampling), strict=True):
                out[i] = o
        return out

    def _generate(self, reqs: list[JudgeRequest], temperature, top_p, top_k, seed) -> list[JudgeOutput]:
        from transformers import GenerationConfig

        from ..rollout.engines.base import left_pad

        ids, mask = left_pad([list(r.prompt) for r in reqs], self.pad)
        sample = temperature > 0
        kw = dict(do_sample=sample, max_new_tokens=max(r.max_tokens for r in reqs))
        if sample:
            # top_k 0: no truncation (transformers' default is 50)
            kw.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else 0)
        if seed is not None:
            torch.manual_seed(seed)
        config = GenerationConfig(pad_token_id=self.pad, eos_token_id=sorted(self.eos), **kw)
        gen = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device), generation_config=config
        )
        outs = []
        for r, row in zip(reqs, gen[:, ids.shape[1] :].tolist(), strict=True):
            row = row[: r.max_tokens]
            end = next((k for k, t in enumerate(row) if t in self.eos), None)
            outs.append(JudgeOutput(row[: end + 1], "stop") if end is not None else JudgeOutput(row, "length"))
        return outs

    def sleep(self) -> None:
        if self.spec.sleeps:
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake(self) -> None:
        if self.spec.sleeps:
            self.model.to(self.device)


class VLLMJudge(JudgeEngine):
    """vllm.LLM in generate mode; its sleep mode frees the device between scorings."""

    name = "vllm"

    def __init__(self, spec: JudgeSpec):
        try:
            import vllm
        except ImportError as e:
            raise JudgeEngineError(f"vLLM is not installed ({e}); {VLLM_INSTALL}") from None
        self.vllm, self.spec, r = vllm, spec, spec.rollout
        kw = dict(
            model=spec.path,
            dtype=spec.dtype,
            seed=0,
            enforce_eager=r["enforce_eager"],
            max_model_len=spec.max_model_len,
            max_num_seqs=r["max_num_seqs"],
            max_num_batched_tokens=r["max_num_batched_tokens"],
            enable_chunked_prefill=r["enable_chunked_prefill"],
            enable_prefix_caching=r["enable_prefix_caching"],
            load_format=r["load_format"],
            trust_remote_code=spec.trust_remote_code,
        )
        if spec.device == "cuda":
            kw.update(gpu_memory_utilization=r["gpu_memory_utilization"], enable_sleep_mode=spec.sleeps)
        kw.update(r["engine_kwargs"].get("vllm", {}))  # the user's word is last
        self.llm = vllm.LLM(**kw)
        self.segments = engine_segments()
        self.sleep()

    def generate(self, requests: list[JudgeRequest]) -> list[JudgeOutput]:
        params = [
            self.vllm.SamplingParams(
                max_tokens=r.max_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, seed=r.seed
            )
            for r in requests
        ]
        outs = self.llm.generate([{"prompt_token_ids": list(r.prompt)} for r in requests], params, use_tqdm=False)
        return [
            JudgeOutput(list(o.outputs[0].token_ids), "length" if o.outputs[0].finish_reason == "length" else "stop")
            for o in outs
        ]

    def sleep(self) -> None:
        if self.spec.sleeps:
            self.llm.sleep(level=1)

    def wake(self) -> None:
        if self.spec.sleeps:
            self.llm.wake_up()

    def close(self) -> None:
        shut_down_vllm(self.llm, self.segments)


class SGLangJudge(JudgeEngine):
    """sglang.Engine on one GPU; it releases its memory between scorings."""

    name = "sglang"

    def __init__(self, spec: JudgeSpec):
        if spec.device != "cuda":
            raise JudgeEngineError("reward_model.rollout.name=sglang runs on GPUs only; use vllm or hf on CPU")
        try:
            import sglang
        except ImportError as e:
            raise JudgeEngineError(f"SGLang is not installed ({e}); {SGLANG_INSTALL}") from None
        r, self.spec = spec.rollout, spec
        kw = dict(
            model_path=spec.path,
            dtype=spec.dtype,
            mem_fraction_static=r["gpu_memory_utilization"],
            context_length=spec.max_model_len,
            max_running_requests=r["max_num_seqs"],
            chunked_prefill_size=r["max_num_batched_tokens"] if r["enable_chunked_prefill"] else -1,
            disable_radix_cache=not r["enable_prefix_caching"],
            load_format=r["load_format"],
            trust_remote_code=spec.trust_remote_code,
            enable_memory_saver=spec.sleeps,
            disable_cuda_graph=r["enforce_eager"],
            random_seed=0,
            log_level="error",
            port=kernel_free_port(),  # never one of the rollout's SGLang engines on the node
        )
        kw.update(r["engine_kwargs"].get("sglang", {}))
        self.engine = sglang.Engine(**kw)
        self.sleep()

    def generate(self, requests: list[JudgeRequest]) -> list[JudgeOutput]:
        params = [
            {"max_new_tokens": r.max_tokens, "temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k}
            | ({"sampling_seed": r.seed} if r.seed is not None else {})
            for r in requests
        ]
        outs = self.engine.generate(input_ids=[list(r.prompt) for r in requests], sampling_params=params)
        return [
            JudgeOutput(
                list(o["output_ids"]),
                "length" if (o["meta_info"].get("finish_reason") or {}).get("type") == "length" else "stop",
            )
            for o in outs
        ]

    def sleep(self) -> None:
        if self.spec.sleeps:
            self.engine.release_memory_occupation()

    def wake(self) -> None:
        if self.spec.sleeps:
            self.engine.resume_memory_occupation()

    def close(self) -> None:
        self.engine.shutdown()


ENGINES: dict[str, type[JudgeEngine]] = {e.name: e for e in (HFJudge, VLLMJudge, SGLangJudge)}


def make_judge_engine(spec: JudgeSpec) -> JudgeEngine:
    return ENGINES[spec.rollout["name"]](spec)
