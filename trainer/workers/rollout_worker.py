"""A worker of the rollout pool (actor_rollout_ref.hybrid_engine=False, verl's one-step-off-policy and fully-async
recipes): one rollout engine on one device, apart from the training workers, generating the prompts the driver
hands it and taking the actor's weights from training rank 0 over the weight-sync group (rollout/weight_sync.py).

Every sample leaves with the log-probs of the policy that generated it (the engine's own; the hf engine's computed
here in one forward pass), which the trainer's off-policy correction needs when it trains a step later."""

from __future__ import annotations

import contextlib
import functools
import gc
import random
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.distributed as dist

from .. import determinism
from ..agent import partial as agent_partial
from ..agent.own_partial import OwnPartials
from ..agent.rollout import AgentRollout
from ..config.schema import from_dict
from ..model import loading
from ..model.checkpoint_names import CheckpointLayout
from ..model.forward import ForwardOptions, token_outputs
from ..model.precision import resolve
from ..reward.scoring import RewardSource, score
from ..rollout.engines import EngineContext, Rollout, Sampling, engine_class, make_engine
from ..rollout.partial import OWN, TOKENS, TURNS, Progress, go_on, packed
from ..rollout.weight_sync import SyncGroup
from . import start_checks
from .base import PoolWorker, collective_timeout, engine_seed, ensure_local_embedded_model, join_group, single_device
from .phase_report import PhaseReport
from .profiling import StepWindows
from .rollout_profiling import RolloutRecorder, engine_recording

SEED_STRIDE = 100_003  # rollout worker i draws from trainer.seed + (i + 1) x this: never a training rank's seed


def on_engine_thread(method):
    """Runs the method on the worker's engine thread, the one its engine was built on. With partial rollouts Ray runs
    this actor's calls on the threads of its concurrency groups, and OpenMP's thread count is a per-thread setting:
    vLLM's CPU engine binds and sizes its OpenMP threads on the thread that builds it (and from then on ignores
    torch.set_num_threads), and its attention kernels refuse to run on a thread whose count differs from the one
    their metadata was made with. Grad mode is per thread too: decorate inside this, not around it."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        return self.lane.submit(method, self, *args, **kwargs).result()

    return run


class RolloutWorker(PoolWorker):
    def __init__(self, cfg_dict: dict, index: int, world: int, master: tuple[str, int], model_path: str, use_gpu: bool):
        """index of world: this worker's place in the pool, whose process group (at master) an engine spanning
        rollout.tensor_model_parallel_size workers is made in, as in the training workers. The start-up refusals
        are asked first; a worker they refuse builds nothing and says why (refusal)."""
        self.cfg = cfg = from_dict(cfg_dict)
        ensure_local_embedded_model(model_path)  # the checks read its config
        cls = engine_class(cfg.actor_rollout_ref.rollout.name)
        self.refused = start_checks.start_refusal(cfg, model_path, cfg.trainer.device, cls)
        if self.refused is not None:
            return
        a = cfg.actor_rollout_ref
        # the workers of one tensor-parallel engine sample the same tokens only from the same seed
        replica = index // a.rollout.tensor_model_parallel_size
        seed = engine_seed(cfg, replica, cfg.trainer.seed + SEED_STRIDE * (replica + 1))
        random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
        if determinism.asked(cfg, ("rollout",)):
            determinism.enable(seed)
        self.device = single_device(use_gpu)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        determinism.engine_env(cfg, self.device.type)
        # the pool's own group: vLLM's external launcher reads its rank, and a tensor-parallel engine's groups are
        # made in it (the training workers have theirs; the weight-sync group spans both)
        join_group(self.device, master, index, world, collective_timeout(a.nccl_timeout))
        self.tok = loading.load_tokenizer(cfg, model_path)
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        prec = resolve(a.actor.fsdp_config, self.device.type, a.actor.strategy, "actor")
        self.dtype = prec.param_dtype  # the engine's copy in the dtype the actor computes in (bf16 on GPUs)
        self.module = None
        if cls.generates_with_actor_module:
            from transformers import AutoModelForCausalLM

            kw = loading.model_kwargs(a.model, model_path)
            self.module = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype, **kw).to(self.device)
            self.module.eval().requires_grad_(False)  # it never trains; weight transfers land in its parameters
        # compute_dtype None: the module is held in its compute dtype already
        recording = engine_recording(cfg, index)
        ctx = EngineContext.of(cfg, self.module, self.tok, model_path, self.device.type, seed)
        ctx.recording = recording
        # a thread's current CUDA device is its own: the engine's thread takes this worker's, as this one did (under a
        # NOSET flag its default, device 0, is another worker's GPU)
        on_device = (torch.cuda.set_device, (self.device,)) if self.device.type == "cuda" else (None, ())
        self.lane = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rollout-engine", initializer=on_device[0], initargs=on_device[1]
        )
        self.engine = self.lane.submit(make_engine, cls, ctx).result()
        # the rollout profiler: the generations for the steps of global_profiler.steps, by the step they are for
        self.recorder = RolloutRecorder(self.engine) if recording is not None else None
        self.recorded = StepWindows.of(cfg).steps
        # the weights arrive as the actor holds them (an MoE's experts fused: fewer, larger transfers) and are
        # converted here for an engine that reads checkpoints
        config = loading.model_kwargs(a.model, model_path)["config"] if cls.checkpoint_layout else None
        self.layout = CheckpointLayout.of(config) if config is not None else None
        self.agent = AgentRollout(self.engine, self.tok, cfg)
        # loops of your own that a weight sync halts stay here between calls (fully async with partial rollouts)
        own = self.agent.own is not None and cfg.async_training.partial_rollout
        self.own_partials = OwnPartials(self.agent, self.agent.own, cfg, self._logprobs) if own else None
        self.reward = RewardSource.of(cfg, self.tok)
        self.sync: SyncGroup | None = None
        self.version = 0  # how many weight syncs this engine has taken: the policy its samples come from
        self.report, self.step = PhaseReport(f"rollout {index}"), 0  # the head's watchdog watches it as a rank
        self.interrupted = -1  # the last partial-rollout call a weight sync interrupted (interrupt)

    def _reported(self, phase: str):
        return self.report.during(phase, self.step)

    def _recorded(self, step: int):
        """The rollout profiler's recording of a generation for `step`, where it records this engine and step."""
        if self.recorder is None or step not in self.recorded:
            return contextlib.nullcontext()
        return self.recorder.generation(step)

    def arm_fault(self, phase: str) -> None:
        """RLRIG_FAULT_HANG (driver/faults.py): hang in `phase` of the next call that runs it."""
        self.report.fault = phase

    def engine_name(self) -> str:
        return self.engine.describe()

    def interruptible(self) -> bool:
        return self.engine.interruptible

    def join_weight_sync(self, master: tuple[str, int], rank: int, world: int) -> None:
        self.sync = SyncGroup(master, rank, world, self.device, self.cfg.actor_rollout_ref.nccl_timeout)
        self.sync.agree_layout(None)

    @on_engine_thread
    def receive_weights(self, version: int) -> None:
        """The weights training rank 0 is sending, straight into the engine, bucket by bucket."""
        with self._reported("sync_rollout_weights"):
            bucket = self.cfg.actor_rollout_ref.rollout.checkpoint_engine.bucket_bytes
            weights = self.sync.receive(self.engine.in_place, bucket)
            self.engine.sync_weights(self.layout(weights) if self.layout is not None else weights)
        self.version = version

    @on_engine_thread
    @torch.no_grad()
    def generate(self, rows: list[dict], n: int, step: int) -> tuple[Rollout, int, float, list[dict], list[dict]]:
        """n samples of each row's prompt (for global step `step`) through the agent loop, with the log-probs of the
        policy that drew them, on the CPU for the trip; the weight version they come from, the seconds it took, and
        each sample's agent-loop fields for its reward function and turn record (agent/rollout.py turn_metrics)."""
        self.step, t0 = step, time.perf_counter()
        with self._reported("rollout_gen"), self._recorded(step):
            self.agent.tracer.at(step)
            ro, turns = self.agent.generate(rows, n)
            if ro.engine_logp is None:
                ro.engine_logp = self._logprobs(ro)
        return ro.to("cpu"), self.version, time.perf_counter() - t0, turns.extra_info(), turns.records()

    def interrupt(self, call: int) -> None:
        """Stop partial-rollout call `call` (or an earlier one) at its next token boundary. Sent in a concurrency group
        of its own (driver/fully_async.py), so it runs while the call generates; a call that has not started yet
        stops at once."""
        self.interrupted = max(self.interrupted, call)

    @on_engine_thread
    @torch.no_grad()
    def generate_partial(self, items: list, step: int, call: int, kind: str = TOKENS) -> Progress:
        """Go on with every unfinished sample of `items` (fresh or interrupted before; `kind` says which they are:
        rollout/partial.py) under the current weights until each ends (EOS or the response length; a multi-turn one
        at its last turn, a loop of your own when it returns) or interrupt(call) stops them all; each new token's
        log-prob is that of the weights that drew it. The kind comes with the call, not from the items: a rank of a
        tensor-parallel engine may have none and must still step with the others."""
        self.step, t0 = step, time.perf_counter()
        max_new, tok = self.cfg.data.max_response_length, self.tok
        stopped = lambda: self.interrupted >= call  # noqa: E731
        with self._reported("rollout_gen"), self._recorded(step):
            self.agent.tracer.at(step)
            if kind == OWN:
                self.own_partials.go_on(items, stopped, self.version)
            elif kind == TURNS:
                agent_partial.go_on(self.agent, items, stopped, self._logprobs, self.version)
            else:
                go_on(self.engine, items, max_new, stopped, self._logprobs, self.version)
        ended = [it for it in items if it.finished]
        going = [it for it in items if not it.finished]
        done = Progress([(it.index, it.versions) for it in ended], None, going, 0.0)
        if ended and kind != TOKENS:
            ro, turns = self.own_partials.packed(ended) if kind == OWN else agent_partial.packed(self.agent, ended)
            done.rollout, done.turns, done.records = ro, turns.extra_info(), turns.records()
        elif ended:
            done.rollout = packed(ended, max_new, tok.pad_token_id, tok.eos_token_id)
        if done.rollout is not None and done.rollout.engine_logp is None:  # a loop of your own that gave none
            done.rollout.engine_logp = self._logprobs(done.rollout).cpu()
        done.secs = time.perf_counter() - t0
        return done

    def _logprobs(self, ro: Rollout) -> torch.Tensor:
        """The hf engine reports none: the module that sampled scores its own tokens, at the rollout's temperature
        (verl's engines' log-probs, the behaviour policy's)."""
        forward = ForwardOptions(temperature=self.cfg.actor_rollout_ref.rollout.temperature)
        ids, mask = ro.input_ids.to(self.device), ro.attention_mask.to(self.device)
        logp, _, _ = token_outputs(self.module, ids, mask, ro.prompt_len, forward)
        return logp.float() * ro.response_mask.to(self.device)

    @on_engine_thread
    @torch.no_grad()
    def evaluate(self, rows) -> tuple[list[float], list[str], list[dict], list[int]]:
        """Validation with rollout.val_kwargs on this engine through the agent loop (driver/validation.py), scored by
        the rules."""
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        with self._reported("testing"):
            self.agent.tracer.at(self.step, validate=True)
            ro, turns = self.agent.generate(rows, vk.n, Sampling.of(vk))
            scores, texts, extras = score(self.tok, self.reward, rows, ro.to("cpu"), vk.n, turns.extra_info())
        return scores.tolist(), texts, extras, [t.num_turns for t in turns.trajs]

    def _drop_engine(self) -> None:
        if self.own_partials is not None:
            self.own_partials.close()
        if self.agent is not None:
            self.agent.close()
        if self.engine is not None:
            self.engine.close()
        self.engine = self.agent = self.module = self.sync = None
        gc.collect()

    def shutdown(self) -> None:
        # the engine first, collected on its own thread, while the process group it may use is still there (as
        # RankWorker.shutdown)
        self.lane.submit(self._drop_engine).result()
        self.lane.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.exit()
