"""Where a step's rewards, no-grad passes and updates come from, each chosen once when the worker is built: a model
held here, the LoRA actor with its adapters disabled, or a pool of its own reached through its Ray handle. The step
calls what it was given and never asks where the model is.

Each source is a callable `(batch) -> tensor` on this worker's device: log-probs [B, R] or values [B, R] (masked).
A critic update `start`s with the batch and returns the call that waits for its stats."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ...algos.core_algos import AllReduce
from ...batch.step_batch import StepBatch
from ...model import lr_schedule, moe, offload
from ...model.build import Models, Trainable
from ...model.forward import ForwardOptions, in_micro_batches, token_outputs
from ...model.micro_batches import MiniBatches
from ...reward.scoring import RewardSource
from ..ppo_update import engine_workers, global_batches, mean_stats, update_actor
from ..timing import Phases


@dataclass(frozen=True)
class LocalLogProbs:
    """No-grad log-probs [B, R] of a model held here, in the micro batches every rank agrees on (with
    forward.with_entropy or with_sum_pi_squared: [B, k, R], the log-probs first, then the entropy, then
    sum_v pi(v)^2, each from the same logits). `module`: the bare model
    (under DDP the wrapper's forward would broadcast buffers: a collective for a pass that needs none). `micro_batches`:
    the worker's (RankWorker._micro_batches) at `micro` rows each or the token budget under `budget_key`. `around`:
    what holds while the pass runs (the model back on the device from host memory, or a LoRA actor's adapters off)."""

    module: torch.nn.Module
    precision: object  # model/precision.Precision: its autocast
    micro: int | None
    budget_key: str
    forward: ForwardOptions
    micro_batches: Callable[[StepBatch, int | None, str], list]
    around: Callable[[], AbstractContextManager] = contextlib.nullcontext

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        tap, recorded = self.forward.tap, []

        def part(sl):
            if tap is not None:  # routing replay (R3): the rows' recorded routing
                tap.feed(None if batch.routed_experts is None else batch.routed_experts[sl])
            with self.precision.autocast():
                ids, mask = batch.input_ids[sl], batch.attention_mask[sl]
                logp, *more = token_outputs(self.module, ids, mask, batch.prompt_len, self.forward)
            if tap is not None and tap.record:
                recorded.append(tap.recorded)
            more = [x for x in more if x is not None]
            return torch.stack((logp, *more), 1) if more else logp

        with self.around():
            parts = self.micro_batches(batch, self.micro, self.budget_key)
            out = in_micro_batches(parts, part)
        if recorded:  # R2: the routing this pass took, in row order, for the update to replay
            tap.pass_routing = in_micro_batches(parts, lambda _: recorded.pop(0))
        return out


@dataclass(frozen=True)
class RemoteLogProbs:
    """The reference's pool (workers/ref_worker.py): the samples cross in their CPU form, the log-probs come back."""

    handle: object  # a RefWorker's Ray actor handle
    device: torch.device

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        import ray

        return ray.get(self.handle.logprobs.remote(batch.only())).to(self.device)


@dataclass(frozen=True)
class LocalValues:
    """The critic held here: its values in its forward micro batches (RankWorker._values), masked."""

    values: Callable[[StepBatch], torch.Tensor]

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        return self.values(batch) * batch.mask


@dataclass(frozen=True)
class RemoteValues:
    """The critic's pool (workers/critic_worker.py): its values, masked here."""

    handle: object  # a CriticWorker's Ray actor handle
    device: torch.device

    def __call__(self, batch: StepBatch) -> torch.Tensor:
        import ray

        return ray.get(self.handle.values.remote(batch.only())).to(self.device) * batch.mask


@dataclass(frozen=True)
class LocalCriticUpdate:
    """The critic held here trains before the actor (RankWorker._update_critic), timed as update_critic."""

    update: Callable[[StepBatch, int], dict]

    def start(self, batch: StepBatch, global_step: int, phases: Phases) -> Callable[[], dict]:
        with phases("update_critic"):
            stats = self.update(batch, global_step)
        return lambda: stats


@dataclass(frozen=True)
class RemoteCriticUpdate:
    """The critic's pool trains while the actor updates here; update_critic times only the wait left after it."""

    handle: object  # a CriticWorker's Ray actor handle

    def start(self, batch: StepBatch, global_step: int, phases: Phases) -> Callable[[], dict]:
        pending = self.handle.update.remote(batch.only("values", "returns"), global_step)

        def wait() -> dict:
            import ray

            with phases("update_critic"):
                return ray.get(pending)

        return wait


def old_logprobs(actor: LocalLogProbs, batch: StepBatch) -> tuple[StepBatch, torch.Tensor | None]:
    """The batch with the actor's log-probs before the update (and, with calculate_sum_pi_squared, sum_v pi(v)^2
    from the same logits, as verl's old-log-prob pass), and the entropy [B, R] where the pass computes it."""
    f = actor.forward
    out = actor(batch)
    if f.tap is not None and f.tap.record:  # actor.router_replay.mode=R2: the update replays this pass's routing
        batch = batch.replace(routed_experts=f.tap.pass_routing)
    if not (f.with_entropy or f.with_sum_pi_squared):
        return batch.replace(old_logp=out), None
    cols = iter(out.unbind(1))
    logp, ent = next(cols), next(cols) if f.with_entropy else None
    more = {"sum_pi_squared": next(cols)} if f.with_sum_pi_squared else {}
    return batch.replace(old_logp=logp, **more), ent


class ProximalLogProbs:
    """compute_prox_log_prob (fully async): the old log-probs from the weights the weight version started with, kept
    in host memory at its first update (as verl's save_model_to_cpu) and swapped in for the pass at the later ones.
    Each rank keeps its own shards."""

    def __init__(self, actor: LocalLogProbs):
        self.actor = actor
        self.version_start: list[torch.Tensor] = []  # the version's first weights, from its first update on

    def __call__(self, batch: StepBatch, local_step: int, on_policy: bool) -> tuple[StepBatch, torch.Tensor | None]:
        params = [p.data.to_local() if hasattr(p.data, "to_local") else p.data for p in self.actor.module.parameters()]
        if local_step == 1:
            self.version_start = [p.to("cpu", copy=True) for p in params]
            return (batch, None) if on_policy else old_logprobs(self.actor, batch)
        now = [p.to("cpu", copy=True) for p in params]
        for p, kept in zip(params, self.version_start):
            p.copy_(kept)
        try:
            return old_logprobs(self.actor, batch)
        finally:
            for p, current in zip(params, now):
                p.copy_(current)


@dataclass(frozen=True)
class ActorUpdate:
    """The actor's update at its scheduled learning rate over its mini batches (RankWorker._mini_batches): its stats
    and the log-probs before its first optimizer step (workers/ppo_update.py)."""

    actor: Trainable
    cfg: object  # the run's Config
    mini_batches: Callable[[StepBatch, int | None, str], MiniBatches]
    batch_sum: AllReduce
    forward: ForwardOptions  # the actor's log-prob pass
    # verl's engine workers' normalisation (use_legacy_worker_impl=disable): the data-parallel ranks the mini batches'
    # counts are summed over; None: the legacy workers', each micro batch weighed by its own rows
    global_dp: int | None
    # verl's rollout/moe/* load metrics, from the engine's routed experts of the batches trained on (model/moe.py)
    rollout_load: moe.LoadStats | None = None

    @classmethod
    def of(cls, actor: Trainable, cfg, mini_batches, batch_sum: AllReduce, forward: ForwardOptions) -> ActorUpdate:
        """An MoE actor's update also records its routers (model/moe.py): the model's auxiliary load-balancing loss
        where its config asks for it, the expert load where rollout.moe_load_balance_metrics_interval is set."""
        sp = forward.sp
        dp = dist.get_world_size() // (sp.size if sp is not None else 1) if engine_workers(cfg) else None
        spec = moe.MoeSpec.of(actor.module)
        if spec is not None:
            interval = cfg.actor_rollout_ref.rollout.moe_load_balance_metrics_interval
            stats = moe.LoadStats() if interval > 0 else None
            replay = replays_routing(cfg)
            tap = moe.RouterTap(spec, spec.routers(actor.module), True, stats, replay=replay)
            forward = dataclasses.replace(forward, tap=tap)
            if stats is not None and cfg.actor_rollout_ref.rollout.enable_rollout_routing_replay:
                return cls(actor, cfg, mini_batches, batch_sum, forward, dp, moe.LoadStats(engine=True))
        return cls(actor, cfg, mini_batches, batch_sum, forward, dp)

    def __call__(self, batch: StepBatch, global_step: int) -> tuple[dict, torch.Tensor | None]:
        cfg, a = self.cfg, self.cfg.actor_rollout_ref.actor
        out = {"actor/lr": lr_schedule.lr_at(a.optim, global_step - 1, cfg.trainer.total_training_steps)}
        lr_schedule.apply(self.actor.opt, out["actor/lr"])
        key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
        mini = self.mini_batches(batch, a.ppo_micro_batch_size_per_gpu, key)
        glob = None if self.global_dp is None else global_batches(batch.mask, mini, self.global_dp, self.batch_sum)
        try:
            stats, actor_logp = update_actor(self.actor, batch, cfg, mini, self.batch_sum, self.forward, glob)
        finally:
            if self.forward.tap is not None:  # the last micro batch's replay, kept for its backward pass
                self.forward.tap.release()
        out.update(mean_stats(stats))
        tap, interval = self.forward.tap, cfg.actor_rollout_ref.rollout.moe_load_balance_metrics_interval
        if self.rollout_load is not None and batch.routed_experts is not None:
            routed = batch.routed_experts[:, batch.prompt_len :]
            self.rollout_load.add_routed(routed, batch.response_mask, tap.spec.num_experts, sorted(tap.routers))
        if tap is not None and tap.stats is not None and global_step % interval == 0:  # verl's: the interval's tokens
            out.update(tap.stats.read("actor/moe", self.batch_sum))
            if self.rollout_load is not None:
                out.update(self.rollout_load.read("rollout/moe", self.batch_sum))
        return out, actor_logp


# --- the choice, made once when the worker is built ---


def replays_routing(cfg) -> bool:
    """actor.router_replay.mode R2 or R3: the actor's update replays the batch's routed_experts (model/moe.py)."""
    return cfg.actor_rollout_ref.actor.router_replay.mode in ("R2", "R3")


def old_pass_tap(module: torch.nn.Module, cfg) -> moe.RouterTap | None:
    """The old-log-prob pass's routers under routing replay: recorded (R2, for the update to replay) or replaying
    the engine's routing (R3); None otherwise."""
    mode = cfg.actor_rollout_ref.actor.router_replay.mode
    spec = moe.MoeSpec.of(module) if mode in ("R2", "R3") else None
    if spec is None:
        return None
    return moe.RouterTap(spec, spec.routers(module), False, None, record=mode == "R2", replay=mode == "R3")


def reward_source(cfg, tok, model_path: str, scorer, pool, rank: int) -> RewardSource:
    """The reward function and, with reward_model.enable, the reward model: `scorer` where it is held here, else its
    pool (`pool`, a RewardWorker's Ray handle). Its input tokenizer is the policy's where the config names none
    other. A generative judge (reward/judge.py) is `scorer`, its server, or the pool worker's; `rank`, this
    training worker's, decides whether it reports a shared server's counters."""
    from ...reward.rules import serves_judge

    rm, model, input_tok = cfg.reward_model, None, None
    if serves_judge(cfg):
        return RewardSource.of(cfg, tok, judge=judge_link(cfg, scorer, pool, rank))
    if scorer is not None:
        model = lambda kind, inputs: getattr(scorer, f"score_{kind}")(inputs)  # noqa: E731
    elif rm.enable:
        import ray

        model = lambda kind, inputs: ray.get(getattr(pool, f"score_{kind}").remote(inputs))  # noqa: E731
    if rm.enable and rm.model.input_tokenizer is not None:
        from transformers import AutoTokenizer

        same = rm.model.input_tokenizer in ("", model_path)
        input_tok = tok if same else AutoTokenizer.from_pretrained(rm.model.input_tokenizer)
    return RewardSource.of(cfg, tok, model, input_tok)


def judge_link(cfg, server, pool, rank: int):
    """The way to the judge: its server here (colocated: woken for each scoring), or its pool worker's, whose
    counters the first training worker it serves (the one of its own rank) reports."""
    from ...reward.judge import JudgeLink

    m = cfg.reward_model.model
    if server is not None:
        return JudgeLink.of(server.address, m.path, m.trust_remote_code, sleeps=True, reports=True)
    import ray

    address, pool_rank = ray.get(pool.judge_address.remote())
    return JudgeLink.of(address, m.path, m.trust_remote_code, sleeps=False, reports=pool_rank == rank)


def reference_source(cfg, m: Models, pool, device: torch.device, forward: ForwardOptions, micro_batches):
    """The reference's log-probs: from its pool (`pool`, a RefWorker's Ray handle), from its model here, from the
    LoRA actor with its adapters disabled (verl's ref_in_actor), or None (no reference in use)."""
    if pool is not None:
        return RemoteLogProbs(pool, device)
    if m.ref is not None:
        module, prec = m.ref, m.ref_precision
        around = functools.partial(offload.module_on, m.ref, device, m.ref_offload)
    elif m.ref_in_actor:
        module, prec, around = m.actor.module, m.actor.precision, m.actor.module.disable_adapter
    else:
        return None
    micro, key = (
        cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu,
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    )
    return LocalLogProbs(module, prec, micro, key, forward, micro_batches, around)


def critic_sources(critic: Trainable | None, pool, device: torch.device, values, update) -> tuple:
    """The critic's values and its update: in its pool (`pool`, a CriticWorker's Ray handle), here (`values` and
    `update`: the worker's passes of `critic`), or (None, None) for an estimator without a critic."""
    if pool is not None:
        return RemoteValues(pool, device), RemoteCriticUpdate(pool)
    if critic is None:
        return None, None
    return LocalValues(functools.partial(values, critic)), LocalCriticUpdate(functools.partial(update, critic))
