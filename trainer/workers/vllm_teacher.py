"""The distillation teacher served by vLLM (distillation.teacher_models.teacher_model.inference.name=vllm, verl's
default wherever the rollout is vLLM's): the log-prob of each token of the student's samples, as verl's teacher
computes it, by vLLM's prompt log-probs (a forward pass at temperature 1; prompt_logprobs=0 gives the token's own).

The engine runs in a child process of its own (reward/vllm_scorer.py's reasons: a worker may hold vLLM's rollout
engine too, and two engines in one process share vLLM's sleep-mode allocator), which sleeps between steps on a
GPU (inference.free_cache_engine) and dies with its parent. With inference.tensor_model_parallel_size = k > 1 an
engine spans k devices, as a verl teacher replica spans k GPUs of its pool: a worker of the teacher's pool holds
k devices itself (distillation.nnodes > 0, verl's placement); colocated, k consecutive training workers share one
engine, started by the first of them, which answers the whole group's samples (rollout/tp_groups.SharedEngine, as
the reward loop's scorer).
"""

from __future__ import annotations

import torch

from ..batch.step_batch import StepBatch
from ..child_process import Child, child_env, serve_vllm
from ..reward.vllm_scorer import INSTALL_HINT

_TP = "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size"


def engine_kwargs(inf, path: str, device: str, rollout_dtype: str, max_model_len: int, trust: bool) -> dict:
    """vllm.LLM arguments from the teacher's inference.*; GPU-only knobs stay off on CPU."""
    dtype = inf.dtype or rollout_dtype
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    kw = dict(
        model=path,
        dtype=dtype,
        seed=0,
        enforce_eager=inf.enforce_eager,
        max_model_len=max_model_len,
        max_num_seqs=inf.max_num_seqs,
        max_num_batched_tokens=max(inf.max_num_batched_tokens, max_model_len),  # a whole sequence in one prefill
        enable_chunked_prefill=inf.enable_chunked_prefill,
        enable_prefix_caching=inf.enable_prefix_caching,
        load_format=inf.load_format,
        trust_remote_code=trust,
    )
    if inf.tensor_model_parallel_size > 1:  # vLLM's own worker processes, one per device
        kw.update(tensor_parallel_size=inf.tensor_model_parallel_size, distributed_executor_backend="mp")
    if device == "cuda":
        kw.update(gpu_memory_utilization=inf.gpu_memory_utilization, enable_sleep_mode=inf.free_cache_engine)
    kw.update(inf.engine_kwargs.get("vllm", {}))  # the user's word is last
    return kw


def token_logprobs(out) -> list[float]:
    """Each token's log-prob after the first from one vLLM output with prompt_logprobs=0 (the first token has
    none): the entry of the token itself in each position's dict."""
    ids, per = out.prompt_token_ids, out.prompt_logprobs
    return [float(per[i][ids[i]].logprob) for i in range(1, len(ids))]


def topk_logprobs(out, k: int) -> tuple[list[list[int]], list[list[float]]]:
    """Each position's k likeliest tokens after the first from one vLLM output with prompt_logprobs=k: (their ids,
    their log-probs), each [positions][k] in rank order, as verl's extract_prompt_logprobs (vLLM adds the token
    itself where it is not among them, with its rank above k: left out)."""
    ids, logps = [], []
    for per in out.prompt_logprobs[1:]:
        top_ids, top = [0] * k, [0.0] * k
        for token, lp in per.items():
            if lp.rank <= k:
                top_ids[lp.rank - 1], top[lp.rank - 1] = int(token), float(lp.logprob)
        ids.append(top_ids)
        logps.append(top)
    return ids, logps


def logprobs(vllm, llm, seqs: list[list[int]], k: int = 0) -> tuple[str, list]:
    """In the child: each sequence's token log-probs, from prompt_logprobs=0 at temperature 1; with k > 0 its k
    likeliest tokens at each position instead (topk_logprobs), from prompt_logprobs=k."""
    params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=k, temperature=1.0)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    return "logprobs", [topk_logprobs(o, k) if k else token_logprobs(o) for o in outs]


def prompt_logprobs_k(cfg) -> int:
    """vLLM's prompt_logprobs for the teacher: distillation_loss.topk for a top-k loss mode, else 0 (the token's
    own)."""
    from ..algos.distillation import TOPK_MODES

    lc = cfg.distillation.distillation_loss
    return lc.topk if lc.loss_mode in TOPK_MODES else 0


class VLLMTeacher:
    """The teacher's log-probs [B, R] of a batch's response tokens (0 where masked), by vLLM in a child process.

    device: the engine's kind (cuda, cpu) and where the log-probs are returned. holds_devices: a worker of the
    teacher's pool, which holds the engine's tensor_model_parallel_size devices itself (Ray's assignment) and returns
    the log-probs on the CPU; otherwise a training worker on one device, which with k > 1 shares its group's engine
    (every worker of the group must then ask at the same time, as the step's teacher phase does)."""

    def __init__(self, cfg, path: str, device: torch.device, holds_devices: bool = False):
        from transformers import AutoConfig

        t, d = cfg.distillation.teacher_models.teacher_model, cfg.data
        inf, trust = t.inference, cfg.actor_rollout_ref.model.trust_remote_code
        # verl's max_model_len: given, else prompt + response lengths, which rlrig caps at the model's positions
        limit = getattr(AutoConfig.from_pretrained(path, trust_remote_code=trust), "max_position_embeddings", None)
        wanted = (inf.prompt_length or d.max_prompt_length) + (inf.response_length or d.max_response_length)
        length = inf.max_model_len or (min(wanted, limit) if limit else wanted)
        rollout_dtype = cfg.actor_rollout_ref.rollout.dtype
        kw = engine_kwargs(inf, path, device.type, rollout_dtype, length, trust)
        self.k = prompt_logprobs_k(cfg)
        if self.k:  # verl's default: vLLM may return as many prompt log-probs as the loss reads
            kw.setdefault("max_logprobs", self.k)
        self.device, self.max_len = torch.device("cpu") if holds_devices else device, length
        sleeps = device.type == "cuda" and inf.free_cache_engine
        start = lambda visible=None: start_child(kw, sleeps, child_env(device.type, visible), path)
        k, self.child, self.shared = inf.tensor_model_parallel_size, None, None
        if k == 1:
            self.child = start()
        elif holds_devices:
            from ..devices import own_gpus_only

            self.child = start(own_gpus_only() if device.type == "cuda" else None)
        else:
            from ..devices import showing
            from ..rollout.tp_groups import SharedEngine

            self.shared = SharedEngine(k, device.type == "cuda", lambda gpus: start(gpus and showing(gpus)), _TP)

    def _ask(self, message: tuple[str, list]) -> tuple[str, object]:
        """The engine's answer to (kind, token lists): this worker's own engine's, or its share of its group's."""
        if self.shared is None:
            return self.child.ask(message)
        kind, seqs, *rest = message

        def reply(child: Child, asked: list) -> list:
            got, value = child.ask((kind, asked, *rest))
            if got != kind:
                raise RuntimeError(value)
            return value

        try:
            return kind, self.shared.ask(seqs, reply)
        except RuntimeError as e:  # the group's engine failed: every member reports it as its own would
            return "error", str(e)

    @torch.no_grad()
    def __call__(self, batch: StepBatch) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """[B, R] log-probs; with a top-k loss mode (prompt_logprobs_k > 0), the k likeliest tokens' log-probs and
        ids at each response position ([B, R, K] each, 0 where masked)."""
        P = batch.prompt_len
        mask = batch.attention_mask.bool().cpu()
        ids = batch.input_ids.cpu()
        seqs = [ids[i][mask[i]].tolist() for i in range(len(ids))]
        too_long = max(len(s) for s in seqs)
        if too_long > self.max_len:
            raise RuntimeError(
                f"a sample of {too_long} tokens is longer than the teacher's max_model_len {self.max_len} "
                "(distillation.teacher_models.teacher_model.inference.max_model_len)"
            )
        kind, value = self._ask(("logprobs", seqs, self.k))
        if kind != "logprobs":
            raise RuntimeError(f"the distillation teacher's vLLM engine failed: {value}")
        if self.k:
            return self.topk_fields(batch, value)
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32)
        for i, logps in enumerate(value):
            prompt = int(mask[i, :P].sum())
            response = mask[i, P:].nonzero().squeeze(1)  # the response's real columns, in order
            # logps[k] is token k+1's; the response's tokens are the sequence's prompt..end
            out[i, response] = torch.tensor(logps[prompt - 1 : prompt - 1 + len(response)], dtype=torch.float32)
        return out.to(self.device) * batch.response_mask.to(self.device)

    def topk_fields(self, batch: StepBatch, value: list) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, R, K] log-probs, [B, R, K] ids) from each sequence's topk_logprobs, placed as __call__ places the
        token's own (position p's entry predicts token p + 1)."""
        P, mask = batch.prompt_len, batch.attention_mask.bool().cpu()
        logp = torch.zeros((*batch.response_mask.shape, self.k), dtype=torch.float32)
        ids = torch.zeros(logp.shape, dtype=torch.long)
        for i, (top_ids, top) in enumerate(value):
            prompt = int(mask[i, :P].sum())
            response = mask[i, P:].nonzero().squeeze(1)
            at = slice(prompt - 1, prompt - 1 + len(response))
            logp[i, response] = torch.tensor(top[at], dtype=torch.float32)
            ids[i, response] = torch.tensor(top_ids[at], dtype=torch.long)
        keep = batch.response_mask.cpu()[..., None]
        return (logp * keep).to(self.device), (ids * keep.long()).to(self.device)

    def close(self) -> None:
        (self.child or self.shared).close()


def start_child(kw: dict, sleeps: bool, env: dict, path: str) -> Child:
    """The engine's child process, started and ready; a RuntimeError saying why where it did not start."""
    child = Child(serve_vllm, (kw, sleeps, env, INSTALL_HINT, logprobs), "rlrig-teacher-vllm")
    kind, value = child.recv()
    if kind != "ready":
        child.close()
        raise RuntimeError(
            f"distillation.teacher_models.teacher_model.inference.name=vllm: the teacher's vLLM engine ({path}) did "
            f"not start: {value}"
        )
    return child
