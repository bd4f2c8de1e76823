"""What the driver sends a training worker for one step, in one object, and the plan the worker reads from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...batch.step_batch import StepBatch
    from ...rollout.engines import Rollout


@dataclass(frozen=True)
class StepRequest:
    """One step on a worker's share of it. `rows`: the prompt rows this worker's engine generates n samples of each
    of; or, where a rollout pool generated (`samples`, a share cut by sample), each sample's prompt row, with each
    sample's agent-loop fields (`turns`, for the reward function) and `first_sample`, its first sample's number in the
    step. `scored`: under DAPO's dynamic sampling, the samples this worker trains on, generated and scored before
    (TrainingWorker.generate) and kept by the driver, their groups numbered in the step. `keep`: hold the step's
    samples for kept_batch (a curriculum sampler's update)."""

    rows: list[dict]
    global_step: int  # counts from 1
    kl_coef: float  # the KL controller's coefficient, for KL in the reward
    samples: Rollout | None = None
    turns: list[dict] | None = None
    first_sample: int = 0
    scored: StepBatch | None = None
    keep: bool = False
    # fully async: this update's place among the weight version's (1 to trigger_parameter_sync_step), else None
    local_step: int | None = None
    # colocated, shared by sample (model/micro_batches.py shares_by_sample): 1, each row one sample whose number in
    # the step counts from first_sample; None: shared by prompt, rollout.n samples of each row
    per_row: int | None = None

    def generated(self, n: int, rank: int) -> tuple[int, int]:
        """(samples the engine generates of each row, the first one's number in the step) for worker `rank` with
        rollout.n = n."""
        if self.per_row is None:
            return n, rank * len(self.rows) * n
        return self.per_row, self.first_sample


@dataclass(frozen=True)
class StepPlan:
    global_step: int  # counts from 1
    kl_coef: float
    update_actor: bool  # the critic trains alone until trainer.critic_warmup steps have passed (verl)
    local_step: int | None = None  # as StepRequest's

    @classmethod
    def of(cls, req: StepRequest, critic_warmup: int) -> StepPlan:
        return cls(req.global_step, req.kl_coef, req.global_step >= critic_warmup, req.local_step)
