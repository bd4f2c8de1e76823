"""A training worker's side of DAPO's dynamic sampling (algorithm.filter_groups.enable): its engine generates and
scores its share of each generation batch (`generate`, TrainingWorker.generate), which goes back to the driver with
each sample's value of the filter's metric; the driver keeps the groups whose values differ until the step's batch
is full (driver/dynamic_sampling.py) and sends each worker its share of them, which the step takes as they are
(`ScoredSamples`, the step's rollout phase) and trains on like any other."""

from __future__ import annotations

from dataclasses import dataclass

from ...algos.filter_groups import sample_values
from ...batch.step_batch import StepBatch
from ..timing import Phases
from .context import Step, StepContext
from .phases import Generate
from .request import StepPlan, StepRequest


@dataclass
class Generated:
    """A worker's share of a generation batch: its samples, scored, on the CPU (`group` numbers the share's prompts
    from 0, prompt i's n samples at rows i*n .. i*n+n-1), each sample's value of the filter's metric (None where the
    reward function returned no such field) and the generation's metrics (timing_s/gen, timing_s/reward, the agent
    loop's)."""

    batch: StepBatch
    values: list
    metrics: dict


@dataclass(frozen=True)
class ScoredSamples:
    """The step's rollout phase under dynamic sampling: the samples the driver kept, which came scored with the
    request (StepRequest.scored). `generate` is this worker's engine, for the generation batches before the step."""

    generate: Generate
    metric: str  # algorithm.filter_groups.metric

    def __call__(self, ctx: StepContext, step: Step) -> Step:
        if step.request.scored is None:
            raise RuntimeError("a step under dynamic sampling trains on the samples the driver kept (request.scored)")
        return step.replace(batch=step.request.scored.to(ctx.device))

    def generated(self, ctx: StepContext, req: StepRequest, phases: Phases) -> Generated:
        """n samples of each of req.rows, scored. More generation batches may follow before the update, so the
        engine is not told that a weight sync comes next (it keeps its weights)."""
        plan = StepPlan(req.global_step, req.kl_coef, update_actor=False)
        step, fields = self.generate.sampled(ctx, Step(req, plan, phases))
        batch = step.batch
        values = sample_values(self.metric, batch.scores.tolist(), fields)
        first = int(batch.group[0]) if len(batch) else 0
        batch = batch.replace(group=batch.group - first)
        return Generated(batch.to("cpu"), values, {**step.metrics, **phases.metrics()})
