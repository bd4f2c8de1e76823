"""SGLang as the rollout engine (GPU only; written against SGLang's offline Engine API, not run here).
With tensor_model_parallel_size > 1 one engine spans that many workers, as verl's hybrid SGLang rollout runs
it: the group's first worker on each node starts SGLang there (tp_size, nnodes, node_rank; rollout/tp_groups.py);
only the group's first worker talks to it (the other nodes' Engine objects have no tokenizer manager). The
group's prompts are generated at once and each worker keeps its own; for a weight sync each worker hands
over CUDA IPC handles of its own full tensors, and SGLang's TP rank i opens those of worker i.

Weights reach the engine with `update_weights_from_tensor` (CUDA IPC handles, no disk), in buckets of at most
rollout.checkpoint_engine.update_weights_bucket_megabytes in the engine's dtype (a layer's attention, which one
call must hold whole, goes alone where it is larger), so the whole model is never materialised twice on the GPU.
Between rollouts `release_memory_occupation` hands the KV cache back to training when free_cache_engine is on,
and the weights too when the caller syncs new ones before the next rollout (generate's sync_follows): SGLang drops
released weights with no host copy, so they are released only where the sync overwrites them anyway.

Every weight call's answer is checked (WeightUpdate): SGLang reports a failed load as a returned (success, message),
never as an exception. Read against the wheels of SUPPORTED: 0.5.16 is the first with LocalSerializedTensor in
model_runner_components.weight_updater (0.5.15 has it in model_runner.py), and 0.5.21 the first that takes weights
only inside a begin_weight_update() ... end_weight_update() session.
"""

from __future__ import annotations

import base64
import os
import re

import numpy as np
import torch
import torch.distributed as dist

from rlrig.entrypoint.cluster.ports import kernel_free_port

from ...devices import gpu_index, node_gpu_id
from .. import tp_groups
from .base import (
    EngineContext,
    RolloutEngine,
    Sampling,
    pack_responses,
    quantized_refusal,
)

INSTALL_HINT = "pip install 'rlrig[sglang]' on a CUDA machine"
SUPPORTED = ">=0.5.16,<0.5.24"  # the releases read (0.5.15 through 0.5.23); pyproject's sglang extra pins the same
BUCKET_BYTES = 512 * 2**20
KV, WEIGHTS = "kv_cache", "weights"  # SGLang's memory tags (sglang.srt.constants)


# a decoder layer's attention: everything up to `model.layers.3.self_attn`
ATTENTION = re.compile(r"^(.*?\.\d+\.self_attn)\.")


def unit(name: str) -> str:
    """What a bucket must not end inside of: one layer's attention tensors. Each bucket is one
    update_weights_from_tensor call, thus one call of the model's load_weights, and some of SGLang's loaders join a
    layer's attention tensors only within one call (DeepSeek's MLA fuses q_a_proj with kv_a_proj_with_mqa through a
    cache of the call, and drops a lone half without a word: sglang 0.5.23 deepseek_weight_loader); every other
    tensor loads by itself (experts by shard, through FusedMoE's weight_loader)."""
    m = ATTENTION.match(name)
    return m.group(1) if m else name


def buckets(weights, dtype, limit: int = BUCKET_BYTES):
    """(name, tensor) pairs cast to the engine's dtype, grouped into lists of at most `limit` bytes that end only
    between units (a unit larger than the limit goes alone)."""
    out, size = [], 0
    for part in units(weights, dtype):
        nbytes = sum(t.numel() * t.element_size() for _, t in part)
        if out and size + nbytes > limit:
            yield out
            out, size = [], 0
        out += part
        size += nbytes
    if out:
        yield out


def units(weights, dtype):
    """The (name, tensor) pairs in the engine's dtype, as lists of one unit each. Each tensor is a copy: some
    loaders write into what they are handed (gpt-oss zeroes its down_proj_bias on every tensor-parallel rank but
    the first, sglang 0.5.23 models/gpt_oss.py), which must not be the actor's own parameter (a bf16 DDP actor's
    cast copies nothing)."""
    part, at = [], None
    for name, t in weights:
        cast = t.to(dtype) if dtype is not None else t
        cast = cast.clone() if cast.data_ptr() == t.data_ptr() else cast
        key = unit(name)
        if part and key != at:
            yield part
            part = []
        at = key
        part.append((name, cast))
    if part:
        yield part


def engine_dtype(cfg) -> str:
    """rollout.dtype as SGLang takes it: auto is bfloat16."""
    return "bfloat16" if cfg.dtype == "auto" else cfg.dtype


def engine_kwargs(
    cfg, model_path: str, max_model_len: int, seed: int, gpu: int = 0, trust_remote_code: bool = False
) -> dict:
    """sglang.Engine arguments from actor_rollout_ref.rollout.*, rollout.engine_kwargs.sglang last. gpu: the worker's
    own among those it sees (devices.gpu_index; under a NOSET flag it sees all of its node's), where SGLang starts a
    one-GPU engine (base_gpu_id): the same numbering on both sides, so the tensors' handles name the same GPU.
    trust_remote_code: model.trust_remote_code."""
    kw = dict(
        model_path=model_path,
        trust_remote_code=trust_remote_code,
        base_gpu_id=gpu,
        skip_tokenizer_init=True,
        dtype=engine_dtype(cfg),
        random_seed=seed,
        tp_size=cfg.tensor_model_parallel_size,
        mem_fraction_static=cfg.gpu_memory_utilization,
        context_length=cfg.max_model_len or max_model_len,
        enable_memory_saver=cfg.free_cache_engine,
        load_format=cfg.load_format,
        disable_cuda_graph=cfg.enforce_eager,
        disable_radix_cache=not cfg.enable_prefix_caching,
        log_level="error",
    )
    if cfg.enable_rollout_routing_replay:  # each request's meta_info carries its tokens' experts, as verl asks
        kw["enable_return_routed_experts"] = True
    if cfg.expert_parallel_size > 1:  # an MoE's experts split over the engine's GPUs, as verl passes SGLang's ep_size
        kw["ep_size"] = cfg.expert_parallel_size
    if cfg.full_determinism:  # SGLang's batch-invariant kernels: its counterpart of vLLM's VLLM_BATCH_INVARIANT
        kw["enable_deterministic_inference"] = True
    return {**kw, **cfg.engine_kwargs.get("sglang", {})}  # rollout.engine_kwargs.sglang.*: the user's word is last


def sampling_params(s: Sampling, max_new: int, eos_id: int) -> dict:
    """SGLang's sampling parameters; do_sample=False (or temperature 0) decodes greedily, as verl does."""
    out = {
        "temperature": 0.0 if s.greedy else s.temperature,
        "top_p": 1.0 if s.greedy else s.top_p,
        "max_new_tokens": max_new,
        "stop_token_ids": [eos_id],
        "skip_special_tokens": False,
    }
    if s.top_k > 0 and not s.greedy:
        out["top_k"] = s.top_k
    return out


def unpack(outputs: list[dict], routed_shape: tuple[int, int] | None = None) -> tuple[list, list, list]:
    """Token ids, their log-probs and routed experts from Engine.generate(..., return_logprob=True) results;
    meta_info.output_token_logprobs holds (logprob, token_id, text) per generated token. `routed_shape`: (decoder
    layers, experts a token) where return_routed_experts asked for meta_info.routed_experts."""
    tokens, logps, routed = [], [], []
    for o in outputs:
        tokens.append(list(o["output_ids"]))
        logps.append([float(t[0]) for t in o["meta_info"]["output_token_logprobs"]])
        got = o["meta_info"].get("routed_experts")
        routed.append(None if got is None or routed_shape is None else decode_routed(got, routed_shape))
    return tokens, logps, routed


def decode_routed(value, shape: tuple[int, int]) -> np.ndarray:
    """One output's routed experts as [prompt + response - 1 tokens, layers, k]: SGLang's tokenizer manager sends
    them as base64 of int32 (0.5.16 to 0.5.23; what its extract_routed_experts_from_meta_info decodes), flat."""
    raw = np.frombuffer(base64.b64decode(value), dtype=np.int32) if isinstance(value, str) else np.asarray(value)
    return raw.reshape(-1, *shape)


def routed_shape(model_path: str, trust_remote_code: bool = False) -> tuple[int, int]:
    """(decoder layers, experts a token) of the MoE at `model_path`, as SGLang records its routed experts (every
    decoder layer, the config's num_hidden_layers): the config SGLang reads, with the model's own code where it
    has some (model.trust_remote_code)."""
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code).get_text_config()
    return int(conf.num_hidden_layers), int(conf.num_experts_per_tok)


def tp_engine_kwargs(layout: tp_groups.NodeLayout, tp: int, dist_init_addr: str, rank: int) -> dict:
    """What an engine spanning workers adds: its size and this node's place in it. Each engine's ports are kept
    apart by the worker's rank, since the workers share a seed from which SGLang would draw the same ones."""
    kw = dict(tp_size=tp, nnodes=layout.nnodes, node_rank=layout.node_rank, base_gpu_id=0, port=30000 + 8 * rank)
    if layout.nnodes > 1:
        kw["dist_init_addr"] = dist_init_addr
    return kw


class SGLangRollout(RolloutEngine):
    """SGLang's offline Engine on GPUs, run by the first worker of its tensor-parallel group, which asks it for
    every member's prompts; it reports each token's log-prob."""

    name = "sglang"
    devices = ("cuda",)
    tensor_parallel = True
    checkpoint_layout = True  # its loaders (load_weights) read checkpoint names: an MoE's experts one by one
    package = ("sglang", "SGLang", INSTALL_HINT)
    supported = SUPPORTED

    @classmethod
    def model_refusal(cls, config) -> str | None:
        """A quantized checkpoint (base.quantized_refusal)."""
        return quantized_refusal(config, "SGLang")

    def __init__(self, ctx: EngineContext):
        why = self.unavailable("cuda")  # the device was checked by make_engine; the package may be missing
        if why:
            raise why
        import sglang

        self.tok, self.cfg, self.max_new = ctx.tokenizer, ctx.cfg, ctx.max_response_length
        self.recording = ctx.recording  # the rollout profiler's settings (start_profile)
        self.dtype = getattr(torch, engine_dtype(ctx.cfg))  # what the engine holds its weights in
        self.released: list[str] = []  # memory tags given back until the next rollout or sync
        length = ctx.max_prompt_length + ctx.max_response_length
        kw = engine_kwargs(ctx.cfg, ctx.model_path, length, ctx.seed, gpu_index(), ctx.trust_remote_code)
        trust = ctx.trust_remote_code
        self.routed_shape = routed_shape(ctx.model_path, trust) if ctx.cfg.enable_rollout_routing_replay else None
        self.group = self.me = None
        self.engine, self.leads = None, True  # leads: this worker talks to the engine
        tp = ctx.cfg.tensor_model_parallel_size
        if tp == 1:
            self.engine = sglang.Engine(**kw)
            return
        self._start_group(sglang, kw, tp)

    def _start_group(self, sglang, kw: dict, tp: int) -> None:
        self.group, self.me, self.members = tp_groups.make_group(tp)
        node, ip = tp_groups.where()
        addr = f"{ip}:{kernel_free_port()}" if self.me == 0 else ""
        members = [None] * tp
        # each worker's own GPU by the node's number for it, also where a NOSET flag shows it all of them
        dist.all_gather_object(members, (node, node_gpu_id(), addr), group=self.group)
        try:
            layout = tp_groups.node_layout([(n, visible) for n, visible, _ in members], self.me)
        except ValueError as e:
            raise RuntimeError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: {e}") from None
        self.leads = self.me == 0
        if layout.starts_engine:
            os.environ.update(SGLANG_BLOCK_NONZERO_RANK_CHILDREN="0", SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK="false")
            kw = {**kw, **tp_engine_kwargs(layout, tp, members[0][2], dist.get_rank())}
            self.engine = tp_groups.with_devices(layout.devices, lambda: sglang.Engine(**kw))
        dist.barrier(group=self.group)  # every node's schedulers are up before the first request

    def start_profile(self, name: str) -> None:
        """SGLang's own torch profiler (Engine.start_profile, with verl's arguments), started by the worker that
        talks to the engine; SGLang names the traces."""
        if self.leads:
            self.engine.start_profile(**self.recording.sglang_args())

    def stop_profile(self) -> None:
        if not self.leads:
            return
        try:
            self.engine.stop_profile()
        except RuntimeError:
            # with profile_token_end SGLang stops by itself after num_steps steps, and then answers a stop with
            # "not in progress" (its ProfileReq; 0.5.16 to 0.5.23)
            if self.recording.token_end is None:
                raise

    def describe(self) -> str:
        """The name, and the tensor-parallel span where there is one."""
        return self.name if self.group is None else f"{self.name}, tensor parallel over {len(self.members)} workers"

    def _resume(self, tag: str):
        if tag in self.released:
            self.engine.resume_memory_occupation(tags=[tag])
            self.released.remove(tag)

    def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
        """RolloutEngine.generate; every member of a tensor-parallel group calls it together, each with its own
        prompts, and gets its own rows."""
        asked, mine = prompts, slice(0, len(prompts) * n)
        if self.group is not None:  # the group's prompts in rank order; the lead asks the engine for all of them
            asked, share = tp_groups.gather_share(self.group, self.me, len(self.members), prompts)
            mine = slice(share.start * n, share.stop * n)
        max_new = self._most(max_new or self.max_new)
        result = [None]
        if self.leads:
            if WEIGHTS in self.released:
                raise RuntimeError("the SGLang engine released its weights for a sync that never came; sync first")
            self._resume(KV)
            expanded = [p for p in asked for _ in range(n)]  # sample i*n..i*n+n-1 belong to prompt i
            routing = {"return_routed_experts": True} if self.cfg.enable_rollout_routing_replay else {}
            outs = self.engine.generate(
                input_ids=expanded,
                return_logprob=True,
                sampling_params=sampling_params(sampling or Sampling.of(self.cfg), max_new, self.tok.eos_token_id),
                **routing,
            )
            result[0] = unpack(outs, self.routed_shape)
            if not hold:
                self.rest(sync_follows)
        if self.group is not None:
            dist.broadcast_object_list(result, src=self.members[0], group=self.group)
        tokens, logps, routed = (x[mine] for x in result[0])
        routed = routed if self.cfg.enable_rollout_routing_replay else None
        eos, pad = self.tok.eos_token_id, self.tok.pad_token_id
        return pack_responses(prompts, n, tokens, logps, max_new, pad, eos, routed)

    def rest(self, sync_follows=False) -> None:
        """With rollout.free_cache_engine, the KV cache's memory released (the weights' too when a sync follows)."""
        if self.leads and self.cfg.free_cache_engine and not self.released:
            self.released = [KV, WEIGHTS] if sync_follows else [KV]
            self.engine.release_memory_occupation(tags=list(self.released))

    def _most(self, value: int) -> int:
        """The largest of the group's values (the lead asks the engine once for all of them)."""
        if self.group is None:
            return value
        t = torch.tensor([int(value)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def agree(self, more: bool) -> bool:
        """Whether any member of the group has more to generate."""
        return bool(self._most(int(more)))

    def sync_weights(self, weights) -> None:
        """The weights in buckets into the engine (update_weights_from_tensor); in a group, each member's tensors as
        handles its lead hands over. The whole iterator is taken even after a failed load (under FSDP each item is a
        collective); the failure is then raised on every member, naming the engine, the bucket and SGLang's words."""
        # released weights come back (their contents stale) to be overwritten; the cache is flushed once, at the end
        if self.leads:
            self._resume(WEIGHTS)
        update = WeightUpdate(self.engine if self.leads else None, self.describe())
        with update:
            if self.group is None:
                for i, chunk in enumerate(buckets(weights, self.dtype, self.cfg.checkpoint_engine.bucket_bytes)):
                    update.bucket(i, chunk)
            else:
                self._hand_over(weights, update)
        failure = [update.failure]
        if self.group is not None:
            dist.broadcast_object_list(failure, src=self.members[0], group=self.group)
        if failure[0]:
            raise RuntimeError(failure[0])

    def _hand_over(self, weights, update: WeightUpdate) -> None:
        """A group's sync: each member's tensors as CUDA IPC handles, which its lead hands to SGLang together."""
        from sglang.srt.model_executor.model_runner_components.weight_updater import LocalSerializedTensor
        from sglang.srt.utils import MultiprocessingSerializer
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions

        monkey_patch_torch_reductions()  # handles name GPUs by UUID: the schedulers number the GPUs differently
        for i, chunk in enumerate(buckets(weights, self.dtype, self.cfg.checkpoint_engine.bucket_bytes)):
            handles = [(name, MultiprocessingSerializer.serialize(t.detach())) for name, t in chunk]
            gathered = [None] * len(self.members) if self.leads else None
            dist.gather_object(handles, gathered, dst=self.members[0], group=self.group)
            if self.leads:
                update.bucket(i, [(name, LocalSerializedTensor(values=h)) for name, h in tp_groups.transpose(gathered)])
            dist.barrier(group=self.group)  # the engine has read every handle before `chunk`'s tensors are freed


class WeightUpdate:
    """One weight sync's calls into an SGLang engine (None: a member that does not talk to it, for which every call
    is nothing), each answer checked. SGLang answers update_weights_from_tensor, begin_weight_update and
    end_weight_update with (success, message) and flush_cache with an object holding .success and .message
    (0.5.16-0.5.23 managers/tokenizer_control_mixin.py); a failure is never an exception. From 0.5.21 an update
    outside a begin_weight_update() ... end_weight_update() session answers success=False (0.5.23
    managers/scheduler_components/weight_updater.py), and a session left open refuses the next begin, so the block
    opens one where the engine has the calls and always closes it. The first failure is kept in `failure`; calls
    after it are skipped (but the session still closed), and the cache is flushed only after a clean update."""

    def __init__(self, engine, name: str):
        self.engine, self.name = engine, name
        self.failure: str | None = None
        self._open = False

    def _answer(self, what: str, call, **kw) -> str | None:
        """What went wrong in `call`, by SGLang's answer, or None."""
        answer = call(**kw)
        ok, message = (answer.success, answer.message) if hasattr(answer, "success") else answer
        return None if ok else f"the weight sync into the engine ({self.name}) failed: {what}: SGLang said {message!r}"

    def _step(self, what: str, call, **kw) -> None:
        if self.engine is not None and self.failure is None:
            self.failure = self._answer(what, call, **kw)

    def __enter__(self) -> WeightUpdate:
        begin = getattr(self.engine, "begin_weight_update", None)
        if begin is not None:
            self._step("begin_weight_update()", begin)
            self._open = self.failure is None
        return self

    def bucket(self, index: int, named: list) -> None:
        """Bucket `index` of the sync, (name, tensor or handles) pairs, into the engine."""
        if self.engine is None:
            return
        what = f"update_weights_from_tensor of bucket {index} ({len(named)} tensors, {named[0][0]} .. {named[-1][0]})"
        self._step(what, self.engine.update_weights_from_tensor, named_tensors=named, flush_cache=False)

    def __exit__(self, *exc) -> None:
        if self.engine is None:
            return
        if self._open:
            self._open = False
            closed = self._answer("end_weight_update()", self.engine.end_weight_update)
            self.failure = self.failure or closed
        if exc[0] is None:
            self._step("flush_cache()", self.engine.flush_cache)
