"""The driver's side of DAPO's dynamic sampling (algorithm.filter_groups.enable, colocated; verl's DAPO recipe):
a step draws generation batches of data.gen_batch_size prompts, which the training workers' engines sample and
score (workers/step/dynamic_sampling.py); the groups whose values of algorithm.filter_groups.metric are all equal
are dropped (algos/filter_groups.py) and the rest kept, in the order drawn, until data.train_batch_size prompts'
groups are; the batch is then cut to exactly that many (the surplus discarded) and shared equally over the workers,
which train on it. Past algorithm.filter_groups.max_num_gen_batches generation batches in one step (0 or less: no
limit) the run stops with verl's message.

Every prompt drawn is consumed, kept or not, as verl's data loader consumes it: a checkpoint records the data's
place after the step's last generation batch. As in verl's recipe, the generation batches stop after
trainer.total_epochs passes over the data: a step the data runs out in is not trained.

Metrics: verl's train/num_gen_batches; the groups dropped and the kept ones discarded past the batch under verl
0.9's v1 names, training/filter_groups/evicted_samples and .../discarded_surplus_samples (both count groups); the
generation's timings summed over the step's generation batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .. import metrics as M
from ..algos.filter_groups import kept_groups
from ..batch.step_batch import StepBatch
from ..errors import ConfigError
from ..workers.timing import PHASES

if TYPE_CHECKING:  # the worker's side (its phases, the agent loop) stays out of the driver's imports
    from ..workers.step.dynamic_sampling import Generated

# the per-sample fields that span the response columns, padded on the right with 0 where widened
_RESPONSE_FIELDS = ("response_mask", "engine_logp", "token_scores")
_ROW_FIELDS = ("reward_components",)  # [B, K]: one row a sample, as wide in every batch


@dataclass
class Filled:
    """A step's batch: its data.train_batch_size prompts in order, each worker's samples of them (consecutive equal
    shares of whole groups, `group` numbering the step's prompts) and the generation's metrics."""

    rows: list[dict]
    shares: list[StepBatch]
    metrics: dict


def too_many(num_gen_batches: int, max_num_gen_batches: int) -> str:
    """verl's DAPO recipe's words when a step's generation batches reach the limit without filling it."""
    return (
        f"{num_gen_batches=} >= {max_num_gen_batches=}. Generated too many. Please check if your data are too "
        "difficult. You could also try set max_num_gen_batches=0 to enable endless trials."
    )


class BatchFiller:
    """Fills a step's batch from generation batches. `draw()` gives the next generation batch's prompt rows (None:
    the data of trainer.total_epochs is used up); `generate(shares)` each worker's Generated for its share of them.
    Holds nothing between steps."""

    def __init__(self, cfg, pad_id: int, workers: int, draw: Callable[[], list[dict] | None], generate):
        fg = cfg.algorithm.filter_groups
        self.metric, self.limit = fg.metric, fg.max_num_gen_batches
        self.prompts, self.n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
        self.pad_id, self.workers, self.draw = pad_id, workers, draw
        self.generate: Callable[[list[list[dict]]], list[Generated]] = generate

    def fill(self) -> Filled | None:
        """The step's batch, or None where the data ran out before it was full. ConfigError past the limit, or where
        the reward function returned no field named by the metric."""
        rows, parts, per_batch, evicted = [], [], [], 0
        while len(rows) < self.prompts:
            drawn = self.draw()
            if drawn is None:
                return None
            size = len(drawn) // self.workers
            shares = [drawn[i * size : (i + 1) * size] for i in range(self.workers)]
            got = self.generate(shares)
            for share, g in zip(shares, got):
                keep = kept_groups(self.checked(g.values), self.n)
                rows += [r for r, k in zip(share, keep) if k]
                parts.append(g.batch.take([gi * self.n + j for gi, k in enumerate(keep) if k for j in range(self.n)]))
                evicted += keep.count(False)
            per_batch.append([g.metrics for g in got])
            if len(rows) < self.prompts and 0 < self.limit <= len(per_batch):
                raise ConfigError(too_many(len(per_batch), self.limit))
        metrics = {
            "train/num_gen_batches": len(per_batch),
            "training/filter_groups/evicted_samples": evicted,
            "training/filter_groups/discarded_surplus_samples": len(rows) - self.prompts,
            **generation_metrics(per_batch),
        }
        return Filled(rows[: self.prompts], self.shared(concat(parts, self.pad_id)), metrics)

    def checked(self, values: list) -> list:
        if any(v is None for v in values):
            raise ConfigError(
                f"algorithm.filter_groups.metric={self.metric}: the reward function returned no {self.metric!r} field "
                "(verl reads it from reward_extra_info: a dict's keys, or acc for a number); use reward, seq_reward, "
                "seq_final_reward, acc or a key your function returns"
            )
        return values

    def shared(self, batch: StepBatch) -> list[StepBatch]:
        """The first data.train_batch_size groups, numbered in the step, in equal consecutive shares."""
        total = self.prompts * self.n
        batch = batch.take(slice(0, total)).replace(group=torch.arange(total) // self.n)
        size = total // self.workers
        return [batch.take(slice(i * size, (i + 1) * size)) for i in range(self.workers)]


def concat(parts: list[StepBatch], pad_id: int) -> StepBatch:
    """The batches' samples as one, in order: prompts left-padded to the widest, responses right-padded to the widest
    (token ids with pad_id, masks and scores with 0)."""
    width = max(p.prompt_len for p in parts)
    resp = max(p.input_ids.shape[1] - p.prompt_len for p in parts)

    def widened(p: StepBatch, name: str, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or t.dim() == 1 or name in _ROW_FIELDS:
            return t
        fill = pad_id if name == "input_ids" else -1 if name == "routed_experts" else 0
        extra = (0, 0) * (t.dim() - 2)  # routed_experts' layer and expert dimensions
        right = lambda r: torch.nn.functional.pad(r, (*extra, 0, resp - r.shape[1]), value=fill)  # noqa: E731
        if StepBatch.spans_prompt(name):
            left = torch.nn.functional.pad(t[:, : p.prompt_len], (*extra, width - p.prompt_len, 0), value=fill)
            return torch.cat([left, right(t[:, p.prompt_len :])], 1)
        if name in _RESPONSE_FIELDS:
            return right(t)
        raise ValueError(f"a generated batch holds no {name} yet")

    fields = {}
    for name in parts[0].per_sample():
        got = [widened(p, name, getattr(p, name)) for p in parts]
        fields[name] = None if any(t is None for t in got) else torch.cat(got)
    return StepBatch(prompt_len=width, **fields)


def generation_metrics(per_batch: list[list[dict]]) -> dict:
    """The workers' generation metrics of each generation batch combined by metrics.py's rules, then over the
    step's generation batches: the phases' timings summed (verl's timer adds them up), the rest by the same rules."""
    batches = [M.reduce(results) for results in per_batch]
    phases = {f"timing_s/{p}" for p in PHASES}
    out = M.reduce(batches)
    out.update({k: sum(b[k] for b in batches if k in b) for k in out if k in phases})
    return out
