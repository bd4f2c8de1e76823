"""The training worker, one per device: actor, rollout engine and (unless in pools of their own) reference and
critic colocated, as verl's hybrid engine.

Workers train data parallel: each holds a shard of the step's samples (its own prompts' where its engine generates
them), and DDP or FSDP (actor.strategy) averages
gradients over all of them with torch.distributed (Gloo on CPU, NCCL on GPU), across nodes. A step is a list
of named phases (timing_s/<phase>), each taking the step's StepBatch and returning it with its fields filled:
rollout (generate, score), balance, forward passes (old log-probs, reference, values), advantages, PF-PPO,
update, weight sync, metrics.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import metrics as M
from ..agent.rollout import AgentRollout
from ..algos import core_algos as algos
from ..algos import estimators, rollout_correction
from ..algos.variance_proxy import variance_proxy_metrics
from ..batch.balance import balance
from ..batch.exchange import pf_ppo_resample, sequence_parallel_share
from ..batch.split_groups import peer_group, whole_batch_advantages
from ..batch.step_batch import StepBatch
from ..model import build, lora, lr_schedule, offload, parallel, ulysses
from ..model.forward import in_micro_batches, token_outputs
from ..model.micro_batches import sequence_parallel, splits_groups
from ..reward.managers import overlong
from ..reward.rules import reward_fn
from ..reward.scoring import RewardSource, score, score_batch
from ..rollout.engines import GREEDY, EngineContext, Rollout, Sampling, engine_class, make_engine
from . import checkpoint_state, profiling
from .base import RankWorker, forked_rngs
from .phase_report import PhaseReport
from .ppo_update import engine_workers, global_batches, mean_stats, update_actor
from .timing import Phases

MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def moe_refusal(model_path: str, load_kwargs: dict, engine_cls) -> str | None:
    """transformers 5 fuses a mixture-of-experts model's expert weights into one tensor per layer, whose
    names vLLM's and SGLang's loaders do not know: syncing them would fail or, worse, load nothing.
    Until those names are mapped back, such a model rolls out with hf only."""
    if engine_cls.generates_with_actor_module:
        return None
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(model_path, **load_kwargs)
    if any(getattr(conf, k, 0) for k in MOE_KEYS):
        return (
            f"{conf.model_type} is a mixture-of-experts model, whose fused expert weights rlrig cannot yet hand to "
            f"{engine_cls.name}; use actor_rollout_ref.rollout.name=hf"
        )
    return None


def sequence_parallel_refusal(cfg, model_path: str) -> str | None:
    """Why the actor's or critic's model cannot split its attention heads over its sequence-parallel group."""
    from transformers import AutoConfig

    a, c, sizes = cfg.actor_rollout_ref, cfg.critic, sequence_parallel(cfg)
    for key, size, path, model in (
        ("actor_rollout_ref.actor", sizes["actor"], model_path, a.model),
        ("critic", sizes["critic"], c.model.path or model_path, c.model if c.model.path else a.model),
    ):
        if size <= 1:
            continue
        impl = model.override_config.get("attn_implementation") or model.override_config.get("_attn_implementation")
        if impl and impl not in ulysses.SUPPORTED:
            return (
                f"{key}.ulysses_sequence_parallel_size={size}: attn_implementation={impl} (override_config) cannot "
                f"attend over a sequence-parallel group; use one of {', '.join(ulysses.SUPPORTED)}"
            )
        why = ulysses.head_refusal(AutoConfig.from_pretrained(path, **build.load_kwargs(model)), size)
        if why:
            return f"{key}.ulysses_sequence_parallel_size={size}: {why}"
    return None


def start_refusal(cfg_dict: dict, model_path: str, device: str) -> str | None:
    """Why a training worker could not start on this node (its rollout engine; its model's heads under sequence
    parallelism), in one line, or None. The driver runs it as a task on every node before it builds any worker, so
    no worker is ever left without an engine."""
    from ..config.schema import from_dict

    cfg = from_dict(cfg_dict)
    a = cfg.actor_rollout_ref
    cls = engine_class(a.rollout.name)
    why = moe_refusal(model_path, build.load_kwargs(a.model), cls) or cls.unavailable(device)
    if why:
        return f"actor_rollout_ref.rollout.name={a.rollout.name}: {why}"
    return sequence_parallel_refusal(cfg, model_path)


def probs_diff(engine_logp, actor_logp, mask) -> dict:
    """verl's rollout-vs-actor check: |p_engine - p_actor| per response token, after the last sync."""
    diff = (engine_logp.exp() - actor_logp.exp()).abs()[mask > 0]
    if diff.numel() == 0:
        return {}
    return {
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std(unbiased=False).item(),
    }


def sampled_mask(batch: StepBatch) -> torch.Tensor:
    """[B, R] float mask of the tokens the engine sampled, as verl reads response lengths (the attention mask):
    rejection sampling leaves it whole."""
    return batch.attention_mask[:, batch.prompt_len :].float()


def allreduce_sum(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


# StepBatch's fields by the names verl's DataProto gives them after a step
VERL_NAMES = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "response_mask": "response_mask",
    "group": "group",
    "engine_logp": "rollout_log_probs",
    "token_scores": "token_level_scores",
    "rewards": "token_level_rewards",
    "old_logp": "old_log_probs",
    "ref_logp": "ref_log_prob",
    "values": "values",
    "advantages": "advantages",
    "returns": "returns",
}


def verl_fields(b: StepBatch) -> dict[str, torch.Tensor]:
    """The batch's tensors by verl's names, with its prompts and responses as verl splits them."""
    out = {verl: getattr(b, ours) for ours, verl in VERL_NAMES.items() if getattr(b, ours) is not None}
    out["prompts"], out["responses"] = b.input_ids[:, : b.prompt_len], b.input_ids[:, b.prompt_len :]
    return out


def leader_metrics(metrics: dict, sp: ulysses.SeqParallel | None) -> dict:
    """The ranks of a sequence-parallel group report the same samples: all but the first leave out the metrics the
    driver sums (metrics.py), which would count them once per rank."""
    if sp is None or sp.rank == 0:
        return metrics
    return {k: v for k, v in metrics.items() if k == M.TOKENS or M.rule(k) != M.SUM}


@dataclass
class Peers:
    """The workers of the roles in pools of their own that this worker sends its samples to (Ray actor handles);
    None: that model is held here."""

    reward_model: object = None
    ref: object = None
    critic: object = None


@dataclass(frozen=True)
class StepPlan:
    global_step: int  # counts from 1
    kl_coef: float  # the KL controller's coefficient, for KL in the reward
    update_actor: bool  # the critic trains alone until trainer.critic_warmup steps have passed (verl)
    # fully async: this update's place among the weight version's (1 to trigger_parameter_sync_step), else None
    local_step: int | None = None


class TrainingWorker(RankWorker):
    holds_models = ("models", "engine")

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
        """rm_path: the reward model (reward_model.enable), held here unless peers.reward_model scores for it."""
        self.peers = peers = peers or Peers()
        super().__init__(cfg_dict, rank, world, master, [model_path, rm_path if peers.reward_model is None else None])
        self.report, self.global_step = PhaseReport(f"rank {rank}"), 0
        cfg, a = self.cfg, self.cfg.actor_rollout_ref
        group = ulysses.make_groups(rank, world, a.actor.ulysses_sequence_parallel_size)
        self.sp = {role: group if size > 1 else None for role, size in sequence_parallel(cfg).items()}
        self.split_groups = splits_groups(cfg)
        self.dp_peers = peer_group(rank, world, a.actor.ulysses_sequence_parallel_size) if self.split_groups else None
        self.estimator = estimators.get(cfg.algorithm.adv_estimator)
        self.tok = build.load_tokenizer(cfg, model_path)
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        # hybrid_engine=False: the engines are the rollout pool's (workers/rollout_worker.py), none here
        engine_cls = engine_class(a.rollout.name) if a.hybrid_engine else None
        needs_critic = self.estimator.needs_critic and peers.critic is None
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
        self.reward = self._reward_source(model_path)
        self.engine = self._engine(engine_cls, model_path) if engine_cls is not None else None
        self.agent = AgentRollout(self.engine, self.tok, cfg) if self.engine is not None else None
        self.turns: dict = {}  # the agent loop's metrics of this step's rollout
        self._keeping, self._kept = False, None  # a step's samples for kept_batch (step's keep)
        self.sync = None  # the weight-sync group to the rollout pool (rank 0 sends in it)
        self._sent_from = None  # rank 0: the actor as the weight sync lays it out (weight_sync.Landing)
        if self.engine is not None:
            # the engine takes the actor's weights: rank 0's, which the wrapper just broadcast (this node's copy on
            # disk need not equal them); an FSDP generation copy is allocated empty until this first sync
            self._sync_engine()
        for t in (self.models.actor, self.models.critic):
            if t is not None and t.param_offload:
                t.module.to("cpu")  # param_offload: back on the device only for the phases that use it

    def _engine(self, engine_cls, model_path: str):
        cfg, a = self.cfg, self.cfg.actor_rollout_ref
        prec = self.models.actor.precision
        ctx = EngineContext(
            self.models.gen_module,
            self.tok,
            a.rollout,
            cfg.data.max_prompt_length,
            cfg.data.max_response_length,
            model_path,
            self.device.type,
            # the ranks of one tensor-parallel engine sample the same tokens only from the same seed
            cfg.trainer.seed + self.rank // a.rollout.tensor_model_parallel_size,
            prec.param_dtype if prec.mixed else None,
        )
        return make_engine(engine_cls, ctx)

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
        from ..reward.reward_model import make_scorer, scorer_settings

        return make_scorer(rm, rm_path, self.device, *scorer_settings(self.cfg))

    def _reward_source(self, model_path: str) -> RewardSource:
        cfg, rm = self.cfg, self.cfg.reward_model
        model = input_tok = None
        if self.rm_scorer is not None:
            model = lambda kind, inputs: getattr(self.rm_scorer, f"score_{kind}")(inputs)
        elif rm.enable:
            import ray

            model = lambda kind, inputs: ray.get(getattr(self.peers.reward_model, f"score_{kind}").remote(inputs))
        if rm.enable and rm.model.input_tokenizer is not None:
            from transformers import AutoTokenizer

            same = rm.model.input_tokenizer in ("", model_path)
            input_tok = self.tok if same else AutoTokenizer.from_pretrained(rm.model.input_tokenizer)
        return RewardSource(reward_fn(cfg), model, input_tok, cfg.data.prompt_key, overlong(rm))

    def _engine_tensors(self, dtype: torch.dtype | None = None):
        """The actor's full tensors (merged with LoRA's adapters), every rank taking part; floating ones cast to
        `dtype` if given."""
        m = self.models
        tensors = parallel.full_tensors(m.actor.module)
        if self.cfg.actor_rollout_ref.model.uses_lora:
            tensors = lora.merged(lora.scalings(m.actor.module), tensors)
        for name, t in tensors:
            yield name, t.to(dtype) if dtype is not None and t.is_floating_point() else t

    def _sync_engine(self) -> None:
        """The actor's weights into this worker's rollout engine, if it has one that needs them."""
        if self.engine is not None and not self.models.gen_is_actor:
            self.engine.sync_weights(self._engine_tensors())

    def engine_name(self) -> str:
        return self.engine.describe()

    # --- the rollout pool's weights (hybrid_engine=False): rank 0 broadcasts, the rollout workers receive ---

    def weight_sync_address(self) -> tuple[str, int]:
        from .base import node_address

        return node_address()

    def join_weight_sync(self, master: tuple[str, int], world: int) -> None:
        """Rank 0 joins the weight-sync group as its rank 0 and tells it the tensors' layout; every rank walks the
        tensors once for it (under FSDP each is a collective)."""
        from ..rollout.weight_sync import Landing, SyncGroup, layout

        actor = self.models.actor
        if self.rank != 0:
            self._gather_for_rank0()
            return
        with offload.module_on(actor.module, self.device, actor.param_offload):
            entries = layout(self._engine_tensors(actor.precision.param_dtype))
        self.sync = SyncGroup(master, 0, world, self.device, self.cfg.actor_rollout_ref.nccl_timeout)
        self.sync.agree_layout(entries)
        self._sent_from = Landing(actor.module)  # the actor's small parameters then live in the packing buffers

    def push_weights(self) -> int:
        """The actor's weights to the rollout pool in the engines' dtype (the one the actor computes in); the bytes
        rank 0 sent (0 elsewhere)."""
        actor = self.models.actor
        with self._reported("sync_rollout_weights"):
            if self.sync is None:
                self._gather_for_rank0()
                return 0
            with offload.module_on(actor.module, self.device, actor.param_offload):
                return self.sync.send(self._engine_tensors(actor.precision.param_dtype), own=self._sent_from)

    def _gather_for_rank0(self) -> None:
        """A rank other than 0 while rank 0 walks the full tensors: under FSDP each is an all-gather every rank joins;
        under DDP rank 0 holds them whole, and nothing here need be read, cast or moved."""
        actor = self.models.actor
        if self.cfg.actor_rollout_ref.actor.strategy != "fsdp":
            return
        with offload.module_on(actor.module, self.device, actor.param_offload):
            for _ in parallel.full_tensors(actor.module):
                pass

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

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

    def step(
        self,
        rows,
        kl_coef: float,
        global_step: int,
        generated: Rollout | None = None,
        local_step: int | None = None,
        turns: list[dict] | None = None,
        keep: bool = False,
        first_sample: int = 0,
    ) -> dict:
        """One PPO step on this worker's share of the step; `global_step` counts from 1. generated: the rollout pool's
        samples (hybrid_engine=False), a share cut by sample: then `rows` holds each sample's prompt row and
        `first_sample` its first sample's number in the step, with each sample's agent-loop fields (`turns`, for the
        reward function); else this worker's engine generates n samples of each of its prompts. local_step: the fully
        async mode's place of this update in its weight version. keep: hold the step's samples for kept_batch (a
        curriculum sampler's update)."""
        self.global_step = global_step
        self._keeping, self._kept = keep, None
        if self.agent is not None:  # none where a rollout pool of its own generates
            self.agent.tracer.at(global_step)
        try:
            return self._step(rows, kl_coef, global_step, generated, local_step, turns, first_sample)
        finally:
            self.report.leave()

    def _step(
        self, rows, kl_coef: float, global_step: int, generated: Rollout | None, local_step, turns, first_sample: int
    ) -> dict:
        cfg, m = self.cfg, self.models
        n = cfg.actor_rollout_ref.rollout.n
        plan = StepPlan(global_step, kl_coef, global_step >= cfg.trainer.critic_warmup, local_step)
        phases = Phases(self._sync_device, self.profiler.phase, lambda name: self.report.enter(name, global_step))
        if generated is None:
            batch = self._rollout(phases, rows, plan)
        else:
            self.turns = {}
            with phases("reward"):  # a row per sample: scored one to one
                ro = StepBatch.from_rollout(generated.to(self.device), n, first_sample)
                batch = score_batch(self.tok, self.reward, rows, ro, 1, turns)
        balanced = {}
        if cfg.trainer.balance_batch:
            with phases("balance"):  # whole prompt groups move, or single samples where groups are split anyway
                batch, balanced = balance(batch, 1 if self.split_groups else n, self.tok.pad_token_id)
        if self.sp["actor"] is not None:
            with phases("sp_share"):  # the group's ranks then train on the same samples, each on its columns
                batch = sequence_parallel_share(batch, self.sp["actor"], self.tok.pad_token_id)
        actor_on = offload.module_on(m.actor.module, self.device, m.actor.param_offload)
        critic_on = offload.module_on(m.critic.module, self.device, m.critic.param_offload) if m.critic else None
        # param_offload: the actor is on the device from its log-prob pass to the weight sync, the critic from
        # its values to its update; both in host memory through generation and scoring
        with actor_on, critic_on or contextlib.nullcontext():
            return leader_metrics({**self._train(phases, batch, plan), **balanced}, self.sp["actor"])

    def _rollout(self, phases: Phases, rows: list[dict], plan: StepPlan) -> StepBatch:
        """Generation and scoring: n samples of each prompt with their scores (and ReMax's greedy baselines)."""
        n = self.cfg.actor_rollout_ref.rollout.n
        # the engine may drop its weights after its last generation of a step that ends in a weight sync
        syncs = plan.update_actor and not self.models.gen_is_actor
        greedy_too = self.estimator.needs_greedy_baseline
        if self.device.type == "cuda" and not self.engine.generates_with_actor_module:
            torch.cuda.empty_cache()  # what training freed goes back before the engine's KV cache wakes
        with phases("gen"):
            ro, turns = self.agent.generate(rows, n, sync_follows=syncs and not greedy_too)
        self.turns = turns.metrics()
        with phases("reward"):
            batch = StepBatch.from_rollout(ro.to(self.device), n, self.rank * len(rows) * n)
            batch = score_batch(self.tok, self.reward, rows, batch, n, turns.extra_info())
        if greedy_too:  # verl's ReMax: each prompt's greedy response (through the same loop), scored
            with phases("gen_max"):
                greedy, turns = self.agent.generate(rows, 1, GREEDY, sync_follows=syncs)
                greedy = StepBatch.from_rollout(greedy.to(self.device), 1)
                baselines = score_batch(self.tok, self.reward, rows, greedy, 1, turns.extra_info()).scores
            batch = batch.replace(baselines=baselines.repeat_interleave(n))
        return batch

    def _train(self, phases: Phases, batch: StepBatch, plan: StepPlan) -> dict:
        cfg = self.cfg
        written = batch.response_mask  # the model's own tokens as sampled, before rejection sampling masks any
        with torch.no_grad():
            batch = self._forward_passes(phases, batch, plan)
        with phases("adv"):
            batch, out = self._advantages(batch, plan)
        if cfg.algorithm.use_pf_ppo:
            with phases("pf_ppo"):
                pf, seed = cfg.algorithm.pf_ppo, cfg.trainer.seed * 1_000_003 + plan.global_step
                batch = pf_ppo_resample(batch, pf.reweight_method, pf.weight_pow, seed, self.tok.pad_token_id)
        if self._keeping:  # the samples as the update takes them, as verl hands its curriculum sampler the batch
            self._kept = batch
        with forked_rngs(self.device):  # the update's draws (dropout) leave the engine's streams as they were
            stats, actor_logp = self._update(phases, batch, plan)
        if plan.update_actor and self.engine is not None:
            with phases("update_weights"):
                self._sync_engine()  # the next rollout samples from the new policy
        actor_logp = actor_logp if actor_logp is not None else batch.old_logp
        if self._kept is not None and self._kept.old_logp is None:  # verl's batch always holds old_log_probs
            self._kept = self._kept.replace(old_logp=actor_logp)
        compared = not self._engine_logp_is_old()  # in verl's old-log-prob pass, which bypass skips
        if batch.engine_logp is not None and actor_logp is not None and compared:
            out.update(probs_diff(batch.engine_logp, actor_logp, written))  # verl's: the tokens the engine wrote
        if batch.sum_pi_squared is not None:  # verl's variance_proxy/*, after the update, for any estimator
            args = (batch.mask, batch.is_weights, stats.get("actor/grad_norm"), self._batch_sum)
            out.update(variance_proxy_metrics(batch.advantages, batch.old_logp, batch.sum_pi_squared, *args))
        return {**out, **stats, **self._metrics(batch, written), **self.turns, **phases.metrics()}

    def kept_batch(self) -> dict | None:
        """The last step's samples (step's keep) on the CPU in verl's names, with each one's prompt number in the
        step's batch (`group`) and the prompt columns (`prompt_len`); None on the ranks of a sequence-parallel group
        after its first, which hold the same samples."""
        b, self._kept = self._kept, None
        sp = self.sp["actor"]
        if b is None or (sp is not None and sp.rank != 0):
            return None
        return {"prompt_len": b.prompt_len, **{k: v.cpu() for k, v in verl_fields(b).items()}}

    def _batch_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over the whole batch of every worker's share (batch statistics): the ranks of a sequence-parallel
        group hold the same samples, so the sum over all workers counts them once per rank."""
        t = allreduce_sum(t)
        sp = self.sp["actor"]
        return t / sp.size if sp is not None else t

    def _engine_logp_is_old(self) -> bool:
        """The engine's log-probs stand as the old ones, with no pass: verl's bypass mode, and its fully async
        trainer's use_rollout_log_probs (unless compute_prox_log_prob asks for the pass)."""
        at = self.cfg.async_training
        fully_async = self.cfg.trainer.async_mode == "fully_async_policy"
        return self.cfg.algorithm.rollout_correction.bypass_mode or (
            fully_async and at.use_rollout_log_probs and not at.compute_prox_log_prob
        )

    def _proximal(self, plan: StepPlan) -> bool:
        """compute_prox_log_prob: the old log-probs come from the weights of the version's first update (verl's
        proximal policy, the one the engines were last sent), which updates after the first must swap back in."""
        at = self.cfg.async_training
        return (
            self.cfg.trainer.async_mode == "fully_async_policy"
            and at.use_rollout_log_probs
            and at.compute_prox_log_prob
            and plan.local_step is not None
        )

    def _on_policy(self, batch: StepBatch, plan: StepPlan) -> bool:
        """One epoch and one mini batch, so one optimizer step after all the forwards: the update's own first
        forward yields the old log-probs, and the extra pass is skipped, as verl and TRL do. Not with
        calculate_sum_pi_squared: the pass also yields sum_pi_squared, which the advantages may need."""
        cfg, a = self.cfg, self.cfg.actor_rollout_ref.actor
        return (
            a.ppo_epochs == 1
            and not a.calculate_sum_pi_squared
            and self.mini >= len(batch)
            and not cfg.algorithm.use_kl_in_reward
            and plan.update_actor
            and not cfg.algorithm.rollout_correction.rollout_is
            and not cfg.algorithm.rollout_correction.rollout_rs
            and not (self._proximal(plan) and plan.local_step > 1)
        )

    def _forward_passes(self, phases: Phases, batch: StepBatch, plan: StepPlan) -> StepBatch:
        """The no-grad passes over the samples: the actor's old log-probs, the reference's, the critic's values."""
        a, m, peers = self.cfg.actor_rollout_ref, self.models, self.peers
        if self._engine_logp_is_old():  # verl's apply_bypass_mode, or its fully async trainer: no pass
            batch = batch.replace(old_logp=batch.engine_logp)
        else:
            with phases("old_log_prob"):
                if self._proximal(plan):
                    batch = self._proximal_logprobs(batch, plan)
                elif not self._on_policy(batch, plan):
                    batch = self._old_logprobs(batch)
        ref_key, ref_micro = (
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
            a.ref.log_prob_micro_batch_size_per_gpu,
        )
        if peers.ref is not None:
            import ray

            with phases("ref"):
                ref_logp = ray.get(peers.ref.logprobs.remote(batch.only())).to(self.device)
                batch = batch.replace(ref_logp=ref_logp)
        elif m.ref is not None:
            with phases("ref"), offload.module_on(m.ref, self.device, m.ref_offload):
                ref_logp = self._logprobs(m.ref, batch, ref_micro, m.ref_precision, ref_key, self.sp["ref"])
                batch = batch.replace(ref_logp=ref_logp)
        elif m.ref_in_actor:
            with phases("ref"), m.actor.module.disable_adapter():
                ref_logp = self._logprobs(m.actor.module, batch, ref_micro, m.actor.precision, ref_key, self.sp["ref"])
                batch = batch.replace(ref_logp=ref_logp)
        if peers.critic is not None:
            import ray

            with phases("values"):
                values = ray.get(peers.critic.values.remote(batch.only())).to(self.device)
                batch = batch.replace(values=values * batch.mask)
        elif m.critic is not None:
            with phases("values"):
                batch = batch.replace(values=self._values(m.critic, batch) * batch.mask)
        return batch

    def _proximal_logprobs(self, batch: StepBatch, plan: StepPlan) -> StepBatch:
        """The old log-probs from the weights the version started with: kept in host memory at its first update (as
        verl's save_model_to_cpu), swapped in for the pass at the later ones. Each rank keeps its own shards."""
        module = self.models.actor.module
        params = [p.data.to_local() if hasattr(p.data, "to_local") else p.data for p in module.parameters()]
        if plan.local_step == 1:
            self._version_start = [p.to("cpu", copy=True) for p in params]
            return batch if self._on_policy(batch, plan) else self._old_logprobs(batch)
        now = [p.to("cpu", copy=True) for p in params]
        for p, kept in zip(params, self._version_start):
            p.copy_(kept)
        try:
            return self._old_logprobs(batch)
        finally:
            for p, current in zip(params, now):
                p.copy_(current)

    def _old_logprobs(self, batch: StepBatch) -> StepBatch:
        """The actor's no-grad log-probs before the update (and, with calculate_sum_pi_squared, sum_v pi(v)^2 from
        the same logits, as verl's old-log-prob pass)."""
        a, actor = self.cfg.actor_rollout_ref, self.models.actor
        key = "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
        micro, spp = a.rollout.log_prob_micro_batch_size_per_gpu, a.actor.calculate_sum_pi_squared
        out = self._logprobs(actor.module, batch, micro, actor.precision, key, self.sp["actor"], spp)
        if not spp:
            return batch.replace(old_logp=out)
        return batch.replace(old_logp=out[:, 0], sum_pi_squared=out[:, 1])

    def _logprobs(
        self,
        module,
        batch: StepBatch,
        micro: int | None,
        prec,
        budget_key: str,
        sp: ulysses.SeqParallel | None = None,
        with_sum_pi_squared: bool = False,
    ) -> torch.Tensor:
        """No-grad log-probs [B, R] in micro batches (with_sum_pi_squared: [B, 2, R], sum_v pi(v)^2 from the same
        logits second); `module` is the bare model (under DDP, the wrapper's forward would broadcast buffers: a
        collective for a pass that needs none)."""
        a = self.cfg.actor_rollout_ref

        def part(sl):
            with prec.autocast():
                logp, _, spp = token_outputs(
                    module,
                    batch.input_ids[sl],
                    batch.attention_mask[sl],
                    batch.prompt_len,
                    remove_padding=a.model.use_remove_padding,
                    share_prompts=a.actor.use_prefix_grouper,
                    sp=sp,
                    with_sum_pi_squared=with_sum_pi_squared,
                    temperature=a.rollout.temperature,
                )
            return torch.stack((logp, spp), 1) if with_sum_pi_squared else logp

        return in_micro_batches(self._micro_batches(batch, micro, budget_key), part)

    def _advantages(self, batch: StepBatch, plan: StepPlan) -> tuple[StepBatch, dict]:
        """Token rewards (minus the KL penalty when it is in the reward), rollout correction, advantages and
        returns."""
        al, out = self.cfg.algorithm, {}
        rewards = batch.token_scores
        if al.use_kl_in_reward:
            args = (batch.old_logp, batch.ref_logp, batch.mask, plan.kl_coef, al.kl_penalty)
            rewards, out["actor/reward_kl_penalty"] = algos.apply_kl_in_reward(batch.token_scores, *args)
        if not al.rollout_correction.bypass_mode:  # bypass mode corrects in the loss, per micro batch
            batch, corr = self._rollout_correction(batch)
            out.update(corr)
        adv_in = estimators.AdvantageInput(
            rewards,
            batch.mask,
            batch.group.tolist(),
            batch.values,
            al.gamma,
            al.lam,
            al.norm_adv_by_std_in_grpo,
            self._batch_sum,
            batch.baselines,
            batch.old_logp,
            batch.sum_pi_squared,
            batch.is_weights,
        )
        if self.split_groups:  # a prompt's samples may be on other workers: the estimator sees the whole batch
            advantages, returns = whole_batch_advantages(self.estimator.fn, adv_in, self.dp_peers)
        else:
            advantages, returns = self.estimator.fn(adv_in)
        return batch.replace(rewards=rewards, advantages=advantages, returns=returns), out

    def _rollout_correction(self, batch: StepBatch) -> tuple[StepBatch, dict]:
        """verl's decoupled rollout correction, once per batch between the old log-probs and the engine's: the
        importance weights (rollout_is), and rejection sampling (rollout_rs), whose rejected tokens leave the response
        mask and with it the advantages and the critic's and actor's losses (not the response lengths)."""
        rc, out = self.cfg.algorithm.rollout_correction, {}
        if rc.rollout_is:
            args = (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_is_batch_normalize, self._batch_sum)
            is_w, corr = rollout_correction.is_weights(batch.old_logp, batch.engine_logp, batch.mask, *args)
            batch = batch.replace(is_weights=is_w)
            out.update(corr)
        if rc.rollout_rs:
            rs = (rc.rollout_rs, rc.rollout_rs_threshold)
            kept, corr = rollout_correction.rejection_mask(batch.old_logp, batch.engine_logp, batch.response_mask, *rs)
            batch = batch.replace(response_mask=kept)
            out.update(corr)
        return batch, out

    def _update(self, phases: Phases, batch: StepBatch, plan: StepPlan):
        """The critic's update, then the actor's (each at its scheduled learning rate); returns the stats and
        the actor's log-probs before its first optimizer step (None when the actor did not update)."""
        cfg, a, m = self.cfg, self.cfg.actor_rollout_ref, self.models
        out, actor_logp, remote_critic = {}, None, None
        if self.peers.critic is not None:  # the critic's update runs in its own pool while the actor updates here
            remote_critic = self.peers.critic.update.remote(batch.only("values", "returns"), plan.global_step)
        elif m.critic is not None:
            with phases("update_critic"):
                out.update(self._update_critic(m.critic, batch, plan.global_step))
        if plan.update_actor:
            with phases("update_actor"):
                out["actor/lr"] = lr_schedule.lr_at(
                    a.actor.optim, plan.global_step - 1, cfg.trainer.total_training_steps
                )
                lr_schedule.apply(m.actor.opt, out["actor/lr"])
                key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
                mini_batches = self._mini_batches(batch, a.actor.ppo_micro_batch_size_per_gpu, key)
                sp = self.sp["actor"]
                glob = None
                if engine_workers(cfg):
                    dp_size = dist.get_world_size() // (sp.size if sp is not None else 1)
                    glob = global_batches(batch.mask, mini_batches, dp_size, self._batch_sum)
                stats, actor_logp = update_actor(m.actor, batch, cfg, mini_batches, self._batch_sum, sp, glob)
                out.update(mean_stats(stats))
        if remote_critic is not None:
            import ray

            with phases("update_critic"):  # only the wait that is left after the actor's update
                out.update(ray.get(remote_critic))
        return out, actor_logp

    def _metrics(self, batch: StepBatch, written: torch.Tensor) -> dict:
        """The batch's own metrics; `written`: the model's tokens as sampled, whose count weighs this worker's
        token means against the others' (verl takes them over the whole batch's response mask; tool turns are
        in the attention mask and not in it)."""
        mask, lengths = batch.mask, sampled_mask(batch).sum(-1)
        out = {
            "critic/score/mean": batch.scores.mean().item(),
            "critic/score/max": batch.scores.max().item(),
            "critic/score/min": batch.scores.min().item(),
            "critic/rewards/mean": batch.rewards.sum(-1).mean().item(),
            "critic/advantages/mean": algos.masked_mean(batch.advantages, mask).item(),
            "response_length/mean": lengths.mean().item(),
            "response_length/max": lengths.max().item(),
            "response_length/min": lengths.min().item(),
            "response_length/clip_ratio": (lengths >= self.cfg.data.max_response_length).float().mean().item(),
            "perf/total_num_tokens": float(batch.attention_mask.sum().item()),
            M.TOKENS: float(written.sum().item()),
        }
        if batch.values is not None:
            out["critic/vf_explained_var"] = algos.explained_variance(batch.values, batch.returns, mask)
        if self.device.type == "cuda":
            out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return out

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
        if self.rm_scorer is not None:
            self.rm_scorer.close()
        if self.engine is not None:
            self.engine.close()
        super().shutdown()
