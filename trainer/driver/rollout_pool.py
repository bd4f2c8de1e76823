"""The driver's side of a rollout pool of its own (actor_rollout_ref.hybrid_engine=False): which batch the engines
generate when, and the weights they generate it with.

synchronous: before step k's batch is generated the engines take the weights of step k-1, so every sample is
  on-policy.
one_step_off_policy (verl's recipe): when step k's batch is in, the engines take the weights of step k-1 and start
  on batch k+1 while the trainer trains on batch k, so each batch is one update behind the weights it trains
  (the staleness the off-policy correction, bypass_mode by default, accounts for).

A batch in flight when a checkpoint is written is not in it: the checkpoint records where the data stood before
that batch was drawn, so a resumed run draws and generates it again and trains every sample once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..agent.rollout import turn_metrics
from ..rollout.engines.base import Rollout, left_pad_to
from .faults import Injected
from .validation import spread

STOP_WAIT_S = 30.0  # within rlrig's default --grace-period after a stop signal's checkpoint


@dataclass
class Share:
    """A training worker's part of a step (the fields of its StepRequest): its samples, their agent-loop fields,
    each one's prompt row (the same dict for a prompt's samples, which pickles once), and where it starts."""

    samples: Rollout
    turns: list[dict]
    rows: list[dict]
    first_sample: int


@dataclass
class InFlight:
    step: int
    rows: list[dict]
    futures: list


def merge(parts: list[Rollout], pad_id: int) -> Rollout:
    """The rollout workers' batches as one, in order, their prompt columns left-padded to the widest."""
    width = max(p.prompt_len for p in parts)

    def widened(p: Rollout, t: torch.Tensor, value) -> torch.Tensor:
        return torch.cat([left_pad_to(t[:, : p.prompt_len], width, value), t[:, p.prompt_len :]], 1)

    logps = [p.engine_logp for p in parts]
    routed = [p.routed_experts for p in parts]
    return Rollout(
        torch.cat([widened(p, p.input_ids, pad_id) for p in parts]),
        torch.cat([widened(p, p.attention_mask, 0) for p in parts]),
        torch.cat([p.response_mask for p in parts]),
        width,
        torch.cat(logps) if all(x is not None for x in logps) else None,
        torch.cat([widened(p, r, -1) for p, r in zip(parts, routed)]) if all(r is not None for r in routed) else None,
    )


class RolloutPool:
    """The rollout pool's engines as the driver schedules them: at most one batch generating at a time (`in_flight`),
    and the weight version the engines hold (`version`) against the trainer's (`trained`, which the driver sets after
    each update); push() sends the trainer's weights when the engines lag."""

    def __init__(self, workers: list, training: list, n: int, pad_id: int):
        self.workers, self.training, self.n, self.pad_id = workers, training, n, pad_id
        self.trained = 0  # the trainer's weight version: updates made (the step it resumed at, then one per step)
        self.version = -1  # the engines': none synced yet (vLLM's dummy load starts them from random weights)
        self.in_flight: InFlight | None = None

    def connect(self) -> None:
        """The weight-sync group: training rank 0 and every rollout worker."""
        import ray

        master = ray.get(self.training[0].weight_sync_address.remote())
        world = 1 + len(self.workers)
        ray.get(
            [t.join_weight_sync.remote(master, world) for t in self.training]
            + [w.join_weight_sync.remote(master, i + 1, world) for i, w in enumerate(self.workers)]
        )

    def push(self) -> dict:
        """The trainer's weights to the engines, if they lag; ordered after any generation in flight (each worker
        runs its calls in turn), which the caller waits for first so no broadcast waits on a generation."""
        import ray

        if self.version == self.trained:
            return {}
        t0 = time.perf_counter()
        sent = ray.get(
            [t.push_weights.remote() for t in self.training]
            + [w.receive_weights.remote(self.trained) for w in self.workers]
        )[0]
        self.version = self.trained
        return {"timing_s/sync_rollout_weights": time.perf_counter() - t0, "perf/weight_sync_bytes": float(sent)}

    def launch(self, step: int, rows: list[dict]) -> None:
        """Step `step`'s prompts spread over the engines."""
        parts = [p for p in spread(rows, len(self.workers)) if p]
        futures = [w.generate.remote(p, self.n, step) for w, p in zip(self.workers, parts)]
        self.in_flight = InFlight(step, rows, futures)

    def settle(self) -> None:
        """Wait for the generation in flight, if any, leaving its result to take()."""
        import ray

        if self.in_flight is not None:
            ray.wait(self.in_flight.futures, num_returns=len(self.in_flight.futures))

    def take(self, step: int) -> tuple[Rollout, list[dict], dict]:
        """Step `step`'s samples, waited for, each sample's agent-loop fields, and the metrics: how long the trainer
        waited, how stale the samples are, and the agent loop's."""
        import ray

        got, self.in_flight = self.in_flight, None
        if got is None or got.step != step:
            raise RuntimeError(f"no rollout in flight for step {step}")
        t0 = time.perf_counter()
        results = ray.get(got.futures)
        waited = time.perf_counter() - t0
        ro = merge([r[0] for r in results], self.pad_id)
        lag = self.trained - min(r[1] for r in results)
        return (
            ro,
            [info for r in results for info in r[3]],
            {
                "timing_s/gen": waited,
                "timing_s/rollout_gen": max(r[2] for r in results),  # the engines' own (the watchdog's measure)
                "training/off_policy_steps": float(lag),
                **turn_metrics([rec for r in results for rec in r[4]]),
            },
        )

    def rollout(
        self, step: int, batch: list[dict], workers: int, faults: Injected, ahead: Callable[[], list[dict]] | None
    ) -> tuple[list[Share], dict]:
        """Step `step`'s samples of `batch`, a share per training worker (of `workers`), and the metrics. A batch not
        generating yet starts now, with the trainer's weights. `ahead` (one step off-policy, but for the last step)
        draws the next step's batch, which starts generating with this step's weights before this batch trains. A
        batch's rollout_gen faults are armed before it starts."""
        pooled = {}
        if self.in_flight is None:
            pooled.update(self.push())
            faults.arm_rollout(step, self.workers)
            self.launch(step, batch)
        ro, turns, waited = self.take(step)
        pooled.update(waited)
        if ahead is not None:
            pooled.update(self.push())
            faults.arm_rollout(step + 1, self.workers)
            self.launch(step + 1, ahead())
        return self.shares(ro, turns, batch, workers), pooled

    def shares(self, ro: Rollout, turns: list[dict], rows: list[dict], workers: int) -> list[Share]:
        """Each training worker's samples, equal consecutive shares cut by sample as verl dispatches its batch (a
        prompt's samples may fall in two shares where the prompts do not divide evenly, model/micro_batches.py's
        splits_groups), with each sample's prompt row and agent-loop fields. `rows`: the prompts `ro` answers, n
        samples each, in order."""
        size, prompt_of = ro.input_ids.shape[0] // workers, [rows[s // self.n] for s in range(len(ro.input_ids))]
        cut = lambda i: slice(i * size, (i + 1) * size)
        return [Share(ro.rows(cut(i)), turns[cut(i)], prompt_of[cut(i)], i * size) for i in range(workers)]

    def stop(self) -> None:
        """The engines hold nothing to save, but shut down they release what they hold beyond their process (vLLM's
        CPU engines spanning workers leave their shared-memory segments behind when killed, and the next such engine
        on the node cannot start, and vLLM frees them as its process exits, which a kill skips): each shuts down after
        a generation in flight and exits; one still busy after STOP_WAIT_S is killed."""
        import ray

        self.in_flight = None
        calls = {w.shutdown.remote(): w for w in self.workers}
        _, busy = ray.wait(list(calls), num_returns=len(calls), timeout=STOP_WAIT_S)
        for ref in busy:
            ray.kill(calls[ref])
