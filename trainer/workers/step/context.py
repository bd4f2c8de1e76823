"""What a training worker's step reads: the context the worker builds once (its models' sources, the choices
the config fixes), and the record of one step that the phases hand on."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...algos.core_algos import AllReduce
from ...algos.estimators import AdvantageInput
from ...batch.step_batch import StepBatch
from ...config.overrides import FULLY_ASYNC
from ...model import offload
from ...model.build import Models
from ...model.ulysses import SeqParallel
from ..timing import Phases
from .request import StepPlan, StepRequest
from .sources import ActorUpdate, LocalCriticUpdate, LocalLogProbs, ProximalLogProbs, RemoteCriticUpdate


def allreduce_sum(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


def batch_sum(sp: SeqParallel | None) -> AllReduce:
    """The sum over the whole batch of every worker's share (batch statistics): the ranks of a sequence-parallel
    group hold the same samples, so the sum over all workers counts them once per rank."""
    if sp is None:
        return allreduce_sum
    return lambda t: allreduce_sum(t) / sp.size


@dataclass(frozen=True)
class OldLogProbs:
    """Which log-probs stand as the old ones, read from the config once; what depends on the batch or the plan is
    a cheap check at each step."""

    engine_is_old: bool  # bypass mode, or fully async with use_rollout_log_probs: the engine's, with no pass
    proximal: bool  # fully async with compute_prox_log_prob: the weights the version started with
    update_may_give: bool  # one epoch with nothing needing them first: the update's own forward may yield them
    mini: int  # this worker's rows per mini batch

    @classmethod
    def of(cls, cfg, mini: int) -> OldLogProbs:
        """engine_is_old: verl's apply_bypass_mode, and its fully async trainer's use_rollout_log_probs unless
        compute_prox_log_prob asks for the pass. update_may_give: one epoch and (checked per step) one mini batch, so
        one optimizer step after all the forwards, as verl and TRL do; not with calculate_sum_pi_squared, whose pass
        also yields what the advantages may need, nor where KL in the reward or rollout correction reads them first."""
        at, al, a = cfg.async_training, cfg.algorithm, cfg.actor_rollout_ref.actor
        fully_async_rollout_logp = cfg.trainer.async_mode == FULLY_ASYNC and at.use_rollout_log_probs
        rc = al.rollout_correction
        return cls(
            engine_is_old=rc.bypass_mode or (fully_async_rollout_logp and not at.compute_prox_log_prob),
            proximal=fully_async_rollout_logp and at.compute_prox_log_prob,
            update_may_give=(
                a.ppo_epochs == 1
                and not a.calculate_sum_pi_squared
                and not al.use_kl_in_reward
                and not rc.rollout_is
                and not rc.rollout_rs
            ),
            mini=mini,
        )

    def proximal_at(self, plan: StepPlan) -> bool:
        """The version's later updates must swap its first weights back in for the pass."""
        return self.proximal and plan.local_step is not None

    def on_policy(self, rows: int, plan: StepPlan) -> bool:
        """The update's own first forward yields the old log-probs, and the extra pass is skipped."""
        return (
            self.update_may_give
            and self.mini >= rows
            and plan.update_actor
            and not (self.proximal_at(plan) and plan.local_step > 1)
        )


@dataclass(frozen=True)
class Sources:
    """Where each of the step's passes runs, chosen once (workers/step/sources.py); None where the run has no such
    model (no reference, no critic, no distillation teacher) or no engine here to sync.

    rollout: the phase that yields the scored batch: this worker's engine generating (phases.Generate), or a rollout
    pool's samples that came with the request (phases.PooledSamples). actor: the actor's old log-prob pass, and
    proximal the same pass over the weight version's first weights."""

    rollout: Callable[[StepContext, Step], Step]
    actor: LocalLogProbs
    proximal: ProximalLogProbs
    ref: Callable[[StepBatch], torch.Tensor] | None  # sources.LocalLogProbs | sources.RemoteLogProbs
    values: Callable[[StepBatch], torch.Tensor] | None  # sources.LocalValues | sources.RemoteValues
    critic_update: LocalCriticUpdate | RemoteCriticUpdate | None
    actor_update: ActorUpdate
    sync_engine: Callable[[], None] | None  # the actor's weights into this worker's engine
    # distillation's teacher (workers/teacher.py): the batch's teacher fields (TeacherFields, RemoteTeacher,
    # TeacherRouter)
    teacher: Callable[[StepBatch], dict[str, torch.Tensor]] | None = None


@dataclass(frozen=True)
class StepContext:
    """Everything a step's phases read besides the step itself, built once by the worker: the config and what it
    fixes (the old log-probs' policy, the advantage estimator over this worker's share or the whole batch, batch
    sums over the data-parallel workers), the models, and where each pass runs (`sources`)."""

    cfg: object  # the run's Config
    device: torch.device
    tok: object  # the policy's tokenizer (scoring decodes with it; its pad token fills moved samples)
    models: Models
    sp: SeqParallel | None  # the actor's sequence-parallel group
    old: OldLogProbs
    estimate: Callable[[AdvantageInput], tuple[torch.Tensor, torch.Tensor]]  # (advantages, returns)
    batch_sum: AllReduce
    balanced_group: int  # the samples that move together in balancing: a prompt's n, or 1 where groups are split
    sources: Sources

    @property
    def pad_id(self) -> int:
        return self.tok.pad_token_id

    @contextlib.contextmanager
    def trained_on_device(self):
        """param_offload: the actor is on the device from its log-prob pass to the weight sync, the critic from its
        values to its update; both in host memory through generation and scoring."""
        m = self.models
        actor_on = offload.module_on(m.actor.module, self.device, m.actor.param_offload)
        critic_on = offload.module_on(m.critic.module, self.device, m.critic.param_offload) if m.critic else None
        with actor_on, critic_on or contextlib.nullcontext():
            yield


@dataclass(frozen=True)
class Step:
    """One step as it moves through the phases: the request and its plan, the phase timer, the batch as far as the
    phases have filled it, and the metrics reported so far."""

    request: StepRequest
    plan: StepPlan
    phases: Phases
    batch: StepBatch | None = None
    metrics: dict = field(default_factory=dict)
    written: torch.Tensor | None = None  # the model's own tokens as sampled, before rejection sampling masks any
    actor_logp: torch.Tensor | None = None  # the actor's log-probs before its first optimizer step
    kept: StepBatch | None = None  # the samples as the update took them (request.keep)

    def replace(self, **changes) -> Step:
        return dataclasses.replace(self, **changes)

    def fill(self, **fields) -> Step:
        """The step with the named fields of its batch filled."""
        return self.replace(batch=self.batch.replace(**fields))

    def report(self, metrics: dict) -> Step:
        return self.replace(metrics={**self.metrics, **metrics})
