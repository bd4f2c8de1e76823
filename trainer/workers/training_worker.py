"""The training worker, one per device: actor, rollout engine and (unless in pools of their own) reference and
critic colocated, as verl's hybrid engine. It hosts the models: builds them, syncs the engine's weights, gathers
and loads checkpoints, validates; its step is the phases of workers/step/, over a StepContext it builds once.

Workers train data parallel: each holds a shard of the step's samples (its own prompts' where its engine generates
them), and DDP or FSDP (actor.strategy) averages gradients over all of them with torch.distributed (Gloo on CPU,
NCCL on GPU), across nodes.
"""

from __future__ import annotations

import dataclasses
import functools
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from ..agent.rollout import AgentRollout
from ..algos import estimators
from ..batch.split_groups import peer_group, whole_batch_advantages
from ..batch.verl_names import verl_fields
from ..config.schema import from_dict
from ..model import build, loading, offload, ulysses
from ..model.forward import ForwardOptions
from ..model.micro_batches import sequence_parallel, splits_groups
from ..reward.scoring import score
from ..rollout.engines import EngineContext, Sampling, engine_class, make_engine
from . import checkpoint_state, profiling, rollout_profiling, start_checks
from .actor_weights import ActorWeights
from .base import RankWorker, engine_seed, ensure_local_embedded_model
from .phase_report import PhaseReport
from .ppo_update import entropy_in_update
from .step import dynamic_sampling, sources
from .step import phases as step_phases
from .step.context import OldLogProbs, Step, StepContext, batch_sum
from .step.context import Sources as StepSources
from .step.request import StepPlan, StepRequest
from .teacher import teacher_source
from .timing import Phases, device_sync


@dataclass
class Peers:
    """The workers of the roles in pools of their own that this worker sends its samples to (Ray actor handles);
    None: that model is held here."""

    reward_model: object = None
    ref: object = None
    critic: object = None
    teacher: object = None  # distillation's teacher (workers/teacher.py)


class TrainingWorker(RankWorker):
    holds_models = ("context", "models", "engine", "weights")  # weights: ActorWeights holds the models too

    def __init__(
        self,
        cfg_dict: dict,
        rank: int,
        world: int,
        master: tuple[str, int],
        model_path: str,
        rm_path: str | None = None,
        peers: Peers | None = None,
    ):
        """rm_path: the reward model (reward_model.enable), held here unless peers.reward_model scores for it.
        Where this worker holds the rollout engine (hybrid_engine), the start-up refusals are asked first; a worker
        they refuse builds nothing and says why (refusal)."""
        cfg = from_dict(cfg_dict)
        # hybrid_engine=False: the engines are the rollout pool's (workers/rollout_worker.py), none here
        a = cfg.actor_rollout_ref
        engine_cls = engine_class(a.rollout.name) if a.hybrid_engine else None
        if engine_cls is not None:
            ensure_local_embedded_model(model_path)  # the checks read its config
            self.refused = start_checks.start_refusal(cfg, model_path, cfg.trainer.device, engine_cls)
            if self.refused is not None:
                return
        self.peers = peers = peers or Peers()
        super().__init__(cfg_dict, rank, world, master, [model_path, rm_path if peers.reward_model is None else None])
        self.report, self.global_step = PhaseReport(f"rank {rank}"), 0
        self.releases = ExitStack()  # what this worker starts beyond its process, closed at shutdown in reverse order
        cfg, a = self.cfg, self.cfg.actor_rollout_ref
        group = ulysses.make_groups(rank, world, a.actor.ulysses_sequence_parallel_size)
        self.sp = {role: group if size > 1 else None for role, size in sequence_parallel(cfg).items()}
        # where a prompt's samples may be on other workers, the ranks that hold distinct samples compute the advantages
        split = splits_groups(cfg)
        self.dp_peers = peer_group(rank, world, a.actor.ulysses_sequence_parallel_size) if split else None
        self.tok = loading.load_tokenizer(cfg, model_path)
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        needs_critic = estimators.get(cfg.algorithm.adv_estimator).needs_critic and peers.critic is None
        # before the models: torch_memory records their allocations too
        self.profiler = profiling.worker_profiler(cfg, rank, self._profiled_roles(needs_critic), "e2e", self.device)
        self.models = build.build(
            cfg,
            model_path,
            self.device,
            needs_critic,
            engine_cls is not None and engine_cls.generates_with_actor_module,
            remote_ref=peers.ref is not None,
        )
        if self.device.type == "cuda":
            # loading the full model before sharding it leaves its memory reserved by torch's allocator; engines in
            # other processes (SGLang, the reward model's vLLM) size their caches from what the GPU has free
            torch.cuda.empty_cache()
        self.rm_scorer = self._local_reward_model(rm_path)
        self.reward = sources.reward_source(cfg, self.tok, model_path, self.rm_scorer, peers.reward_model, rank)
        recording = rollout_profiling.engine_recording(cfg, rank) if engine_cls is not None else None
        self.engine = self._engine(engine_cls, model_path, recording) if engine_cls is not None else None
        if recording is not None:  # the tool is torch, so this worker's profiler is its own (not profiling.OFF)
            self.profiler.rollout = rollout_profiling.RolloutRecorder(self.engine)
        self.agent = AgentRollout(self.engine, self.tok, cfg) if self.engine is not None else None
        if self.agent is not None:  # closed before its engine
            self.releases.callback(self.agent.close)
        self.context = self._step_context()
        self._kept = None  # the last step's samples, where its request asked to keep them (kept_batch)
        self.weights = ActorWeights(cfg, self.models, self.device, rank, engine_cls)
        if self.engine is not None:
            # the engine takes the actor's weights: rank 0's, which the wrapper just broadcast (this node's copy on
            # disk need not equal them); an FSDP generation copy is allocated empty until this first sync
            self._sync_engine()
        for t in (self.models.actor, self.models.critic):
            if t is not None and t.param_offload:
                t.module.to("cpu")  # param_offload: back on the device only for the phases that use it

    def roles(self) -> tuple[str, ...]:
        """RankWorker.roles: the actor, its engine (hybrid_engine), and the reference and critic unless in pools of
        their own."""
        cfg, peers = self.cfg, self.peers
        held = {
            "actor": True,
            "rollout": cfg.actor_rollout_ref.hybrid_engine,
            "ref": cfg.ref_in_use and peers.ref is None,
            "critic": estimators.get(cfg.algorithm.adv_estimator).needs_critic and peers.critic is None,
        }
        return tuple(role for role, here in held.items() if here)

    def _engine(self, engine_cls, model_path: str, recording):
        cfg, a = self.cfg, self.cfg.actor_rollout_ref
        prec = self.models.actor.precision
        # the ranks of one tensor-parallel engine sample the same tokens only from the same seed
        replica = self.rank // a.rollout.tensor_model_parallel_size
        seed = engine_seed(cfg, replica, cfg.trainer.seed + replica)
        dtype = prec.param_dtype if prec.mixed else None
        ctx = EngineContext.of(cfg, self.models.gen_module, self.tok, model_path, self.device.type, seed, dtype)
        ctx.recording = recording
        engine = make_engine(engine_cls, ctx)
        self.releases.callback(engine.close)
        return engine

    def _step_context(self) -> StepContext:
        """What the step reads, chosen here once (workers/step/context.py)."""
        cfg, a, m, peers, sp = self.cfg, self.cfg.actor_rollout_ref, self.models, self.peers, self.sp["actor"]
        estimator, split = estimators.get(cfg.algorithm.adv_estimator), splits_groups(cfg)
        estimate = estimator.fn
        if split:  # a prompt's samples may be on other workers: the estimator sees the whole batch
            estimate = functools.partial(whole_batch_advantages, estimate, peers=self.dp_peers)
        total, actor_forward = batch_sum(sp), ForwardOptions.of(cfg, sp)
        actor = sources.LocalLogProbs(
            m.actor.module,
            m.actor.precision,
            a.rollout.log_prob_micro_batch_size_per_gpu,
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
            dataclasses.replace(
                actor_forward,
                with_sum_pi_squared=a.actor.calculate_sum_pi_squared,
                with_entropy=not entropy_in_update(a.actor),  # actor/entropy from this pass, as verl 0.9's
                tap=sources.old_pass_tap(m.actor.module, cfg),
            ),
            self._micro_batches,
        )
        ref_forward = ForwardOptions.of(cfg, self.sp["ref"])
        values, critic_update = sources.critic_sources(
            m.critic, peers.critic, self.device, self._values, self._update_critic
        )
        if self.agent is not None:
            rollout = step_phases.Generate(self.agent, self.reward, self.rank, estimator.needs_greedy_baseline)
        else:
            rollout = step_phases.PooledSamples(self.reward)
        if cfg.algorithm.filter_groups.enable:  # generate() samples; the step trains on the groups the driver kept
            rollout = dynamic_sampling.ScoredSamples(rollout, cfg.algorithm.filter_groups.metric)
        found = StepSources(
            rollout=rollout,
            actor=actor,
            proximal=sources.ProximalLogProbs(actor),
            ref=sources.reference_source(cfg, m, peers.ref, self.device, ref_forward, self._micro_batches),
            values=values,
            critic_update=critic_update,
            actor_update=sources.ActorUpdate.of(m.actor, cfg, self._mini_batches, total, actor_forward),
            sync_engine=self._sync_engine if self.engine is not None else None,
            teacher=teacher_source(cfg, self.device, peers.teacher, self._micro_batches, self.releases),
        )
        return StepContext(
            cfg=cfg,
            device=self.device,
            tok=self.tok,
            models=m,
            sp=sp,
            old=OldLogProbs.of(cfg, self.mini),
            estimate=estimate,
            batch_sum=total,
            balanced_group=1 if split else a.rollout.n,
            sources=found,
        )

    def _profiled_roles(self, critic_here: bool) -> dict[str, str]:
        """The roles whose phases run here -> the role whose profiler records them, in verl's start order: the
        reference inside a LoRA actor is the actor's (verl's ref_in_actor); verl's reward loop has no profiler."""
        cfg, rm = self.cfg, self.cfg.reward_model
        roles = {"actor": "actor"}
        if cfg.ref_in_use and self.peers.ref is None:
            roles["ref"] = "actor" if cfg.actor_rollout_ref.model.uses_lora else "ref"
        if critic_here:
            roles["critic"] = "critic"
        if rm.enable and self.peers.reward_model is None and not rm.use_reward_loop:
            roles["reward_model"] = "reward_model"
        return roles

    def _local_reward_model(self, rm_path: str | None):
        """The reward model when it is held here (reward_model.enable without a pool of its own), else None."""
        rm = self.cfg.reward_model
        if not rm.enable or self.peers.reward_model is not None:
            return None
        from ..reward.rules import serves_judge

        if serves_judge(self.cfg):
            from ..reward.judge import judge_spec
            from ..reward.judge_server import JudgeServer

            scorer = JudgeServer(judge_spec(rm, rm_path, self.device.type))
        else:
            from ..reward.reward_model import make_scorer, scorer_settings

            scorer = make_scorer(rm, rm_path, self.device, *scorer_settings(self.cfg))
        self.releases.callback(scorer.close)
        return scorer

    def _sync_engine(self) -> None:
        """The actor's weights into this worker's rollout engine, if it has one that needs them."""
        if self.engine is not None and not self.models.gen_is_actor:
            self.engine.sync_weights(self.weights.tensors())

    def engine_name(self) -> str:
        return self.engine.describe()

    # --- the rollout pool's weights (hybrid_engine=False): rank 0 broadcasts, the rollout workers receive ---

    def weight_sync_address(self) -> tuple[str, int]:
        from .group_address import node_address

        return node_address()

    def join_weight_sync(self, master: tuple[str, int], world: int) -> None:
        self.weights.join(master, world)

    def push_weights(self) -> int:
        """The actor's weights to the rollout pool (ActorWeights.push): the bytes rank 0 sent (0 elsewhere)."""
        with self._reported("sync_rollout_weights"):
            return self.weights.push()

    def _reported(self, phase: str):
        return self.report.during(phase, self.global_step)

    def arm_fault(self, phase: str) -> None:
        """RLRIG_FAULT_HANG (driver/faults.py): hang in `phase` of the next step."""
        self.report.fault = phase

    def evaluate(self, rows) -> tuple[list[float], list[str], list[dict], list[int]]:
        """Validation with rollout.val_kwargs: each prompt's n scores, texts, reward-function fields and turns (the
        agent loop's num_turns), prompt by prompt."""
        vk = self.cfg.actor_rollout_ref.rollout.val_kwargs
        with self._reported("testing"):
            self.agent.tracer.at(self.global_step, validate=True)
            ro, turns = self.agent.generate(rows, vk.n, Sampling.of(vk))
            scores, texts, extras = score(self.tok, self.reward, rows, ro, vk.n, turns.extra_info())
        return scores.tolist(), texts, extras, [t.num_turns for t in turns.trajs]

    # --- one step ---

    def step(self, req: StepRequest) -> dict:
        """One PPO step on this worker's share of the step (StepRequest): its metrics."""
        self.global_step, self._kept = req.global_step, None
        if self.agent is not None:  # none where a rollout pool of its own generates
            self.agent.tracer.at(req.global_step)
        phases = Phases(
            device_sync(self.device), self.profiler.phase, lambda name: self.report.enter(name, req.global_step)
        )
        plan = StepPlan.of(req, self.cfg.trainer.critic_warmup)
        try:
            done = step_phases.run(self.context, Step(req, plan, phases))
        finally:
            self.report.leave()
        self._kept = done.kept
        return done.metrics

    def generate(self, req: StepRequest) -> dynamic_sampling.Generated:
        """DAPO's dynamic sampling (algorithm.filter_groups.enable): n samples of each of req.rows, scored, with each
        one's value of the filter's metric (workers/step/dynamic_sampling.py); the step on the kept ones follows."""
        self.global_step = req.global_step
        self.agent.tracer.at(req.global_step)
        phases = Phases(
            device_sync(self.device), self.profiler.phase, lambda name: self.report.enter(name, req.global_step)
        )
        try:
            return self.context.sources.rollout.generated(self.context, req, phases)
        finally:
            self.report.leave()

    def kept_batch(self) -> dict | None:
        """The last step's samples (its request's keep) on the CPU in verl's names, with each one's prompt number in
        the step's batch (`group`) and the prompt columns (`prompt_len`); None on the ranks of a sequence-parallel
        group after its first, which hold the same samples."""
        b, self._kept = self._kept, None
        sp = self.sp["actor"]
        if b is None or (sp is not None and sp.rank != 0):
            return None
        return {"prompt_len": b.prompt_len, **{k: v.cpu() for k, v in verl_fields(b).items()}}

    # --- checkpoints: full tensors by name; every rank gathers (a collective), rank 0 returns them ---

    def state(self) -> dict | None:
        a, c = self.cfg.actor_rollout_ref.actor, self.cfg.critic
        with self._reported("save_checkpoint"):
            return checkpoint_state.gather(
                self.models, self.rank, a.checkpoint.save_contents, c.checkpoint.save_contents
            )

    def rng_state(self) -> dict:
        return checkpoint_state.rng_state()

    def load(self, state: dict, rng: dict | None) -> None:
        a, c = self.cfg.actor_rollout_ref.actor, self.cfg.critic
        checkpoint_state.load(self.models, state, a.checkpoint.loads, c.checkpoint.loads)
        if rng:
            checkpoint_state.set_rng_state(rng)
        actor = self.models.actor
        with offload.module_on(actor.module, self.device, actor.param_offload):
            self._sync_engine()

    def shutdown(self) -> None:
        # the models before the engine: closing a vLLM engine destroys the default process group (vLLM 0.32's
        # EngineCore.shutdown ends in cleanup_dist_env_and_memory), which they must outlive (release_models)
        self.release_models()
        self.releases.close()
        super().shutdown()
