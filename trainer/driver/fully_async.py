"""verl's fully async mode (async_training.*, its fully_async_policy recipe) on rlrig's rollout pool.

The engines stream: each rollout worker generates a few prompts at a time, as many as the freshness control lets
start (driver/sample_queue.py), and every finished prompt group joins a queue. The trainer takes require_batches x
ppo_mini_batch_size prompts from it for each update, as soon as they are there, while the engines go on; after
trigger_parameter_sync_step updates it sends its weights (a new version; rlrig's step, as verl logs and checkpoints
by it). Without partial rollouts the generations in flight at a sync finish first under the weights they started
with, as verl's do; with them (async_training.partial_rollout) the sync interrupts them at a token boundary and they
go on under the new weights, first of all (rollout/partial.py).

Every prompt is trained once: a checkpoint (always at the end of a version) records where the draw stands and the
prompts drawn but not trained (queued or in flight), which a resumed run generates first; a group dropped as staler
than the bound is counted and not drawn again.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .. import metrics as M
from ..agent.loop import TOOL_AGENT
from ..agent.own_loops import loop_table
from ..agent.own_partial import LoopPartial
from ..agent.partial import AgentPartial
from ..agent.rollout import turn_metrics
from ..agent.setup import agent_of
from ..data.sampler import Sampler
from ..rollout.engines.base import Rollout
from ..rollout.partial import OWN, TOKENS, TURNS, Partial, Progress
from .rollout_pool import merge
from .sample_queue import Freshness, Group, SampleQueue, stale_bound

CONTROL = "control"  # the rollout workers' concurrency group for interrupts (driver/launch.py)


def total_prompts(cfg, prompts: int) -> int:
    """The prompts a run generates (verl's total_rollout_steps): rollout.total_rollout_steps, at most the data set
    over trainer.total_epochs (verl's cap) and over rollout.total_epochs (the epochs its rollouter walks)."""
    cap = prompts * min(cfg.trainer.total_epochs, cfg.rollout.total_epochs)
    asked = cfg.rollout.total_rollout_steps
    return min(asked, cap) if asked is not None else cap


def total_versions(cfg, prompts: int) -> tuple[int, int]:
    """(updates, weight versions) the run makes: every whole update the prompts fill, trigger_parameter_sync_step to
    a version (the last one may have fewer); trainer.total_training_steps, if given, caps the versions."""
    updates = total_prompts(cfg, prompts) // cfg.data.train_batch_size
    versions = math.ceil(updates / cfg.async_training.trigger_parameter_sync_step)
    if cfg.trainer.total_training_steps is not None:
        versions = min(versions, cfg.trainer.total_training_steps)
        updates = min(updates, versions * cfg.async_training.trigger_parameter_sync_step)
    return updates, versions


@dataclass
class Call:
    """A generation in flight on one engine: a call on each of its workers, each with its share of the prompts."""

    refs: list
    shares: list[list[int]]  # prompt indices, per worker
    number: int | None  # a partial-rollout call's number, which its interrupt names


def split(xs: list, parts: int) -> list[list]:
    """xs in `parts` consecutive runs of near-equal length (an engine's workers each ask for their own share; a
    tensor-parallel one's ranks generate all of them together)."""
    size, extra = divmod(len(xs), parts)
    out, at = [], 0
    for i in range(parts):
        n = size + (i < extra)
        out.append(xs[at : at + n])
        at += n
    return out


class Stream:
    """The queue between the rollout pool and the trainer, and the generations feeding it."""

    def __init__(self, pool, rows: list[dict], cfg, sampler: Sampler, planned: int):
        """planned: the updates the run makes (total_versions)."""
        at = cfg.async_training
        self.pool, self.rows, self.sampler = pool, rows, sampler
        self.n = cfg.actor_rollout_ref.rollout.n
        self.required = cfg.data.train_batch_size  # require_batches x ppo_mini_batch_size (config/overrides.py)
        self.trigger = at.trigger_parameter_sync_step
        self.freshness = Freshness(self.required, at.staleness_threshold, self.trigger)
        self.queue = SampleQueue(stale_bound(at.staleness_threshold))
        self.updates, self.planned = 0, planned
        self.limit = total_prompts(cfg, len(rows))
        self.todo: deque[int] = deque()  # drawn before a resume and never trained: generated first
        self.partial = at.partial_rollout
        agent = cfg.actor_rollout_ref.rollout.agent
        names = {agent_of(r, agent.default_agent_loop) for r in rows}
        # loops of your own stay on their engine's worker across syncs (agent/own_partial.py); multi-turn rows go on
        # as whole trajectories (agent/partial.py), single-turn ones as tokens, on whichever engine takes them
        own = names & set(loop_table(agent.agent_loop_config_path))
        self.kind = OWN if own else TURNS if TOOL_AGENT in names else TOKENS
        self.resumed: deque = deque()  # interrupted by a sync: they go on first, under the new weights
        self.calls = 0  # partial-rollout calls made, each numbered for its interrupt
        tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
        self.engines = [pool.workers[i : i + tp] for i in range(0, len(pool.workers), tp)]
        # a chunk per engine at a time: the engines together start about one update's prompts
        self.chunk = max(1, math.ceil(self.required / len(self.engines)))
        self.busy: dict[int, Call] = {}  # by engine
        self.ready: set = set()  # calls' results in, of engines some of whose workers are still at it
        self.idle_s = [0.0] * len(self.engines)
        self.idle_from = [time.perf_counter()] * len(self.engines)
        self.stale_samples = self.stale_trajectories = 0
        self.gen_s = 0.0  # the longest generation call since the last version's metrics (the watchdog's measure)

    # --- the engines' side ---

    def drawn(self) -> int:
        return self.sampler.epoch * self.sampler.n + self.sampler.pos

    def _draw(self, k: int) -> list[int]:
        out = []
        while len(out) < k and self.todo:
            out.append(self.todo.popleft())
        while len(out) < k and self.drawn() < self.limit:
            out += self.sampler.next()
        return out

    def more_to_generate(self) -> bool:
        return bool(self.todo) or bool(self.resumed) or self.drawn() < self.limit

    def exhausted(self) -> bool:
        """No further update can be made: the planned ones are, or the prompts left cannot fill one."""
        if self.updates >= self.planned:
            return True
        return not self.busy and not self.more_to_generate() and len(self.queue) < self.required

    def feed(self, step: int) -> None:
        """Start a generation on every idle engine, as far as the freshness control lets."""
        for e, members in enumerate(self.engines):
            if e in self.busy:
                continue
            # interrupted ones first: started already, they count against no version's freshness again (verl's)
            items = self._resumed_on(e)
            room = self.freshness.room(len(self.queue))
            indices = self._draw(min(self.chunk - len(items), room)) if room > 0 else []
            if not items and not indices:
                return
            self.freshness.start(len(indices))
            if self.partial:
                items += [self._fresh(i, e) for i in indices]
                self.calls += 1
                shares = split(items, len(members))
                refs = [w.generate_partial.remote(sh, step, self.calls, self.kind) for w, sh in zip(members, shares)]
                self.busy[e] = Call(refs, [[it.index for it in sh] for sh in shares], self.calls)
            else:
                shares = split(indices, len(members))
                refs = [w.generate.remote([self.rows[i] for i in sh], self.n, step) for w, sh in zip(members, shares)]
                self.busy[e] = Call(refs, shares, None)
            self.idle_s[e] += time.perf_counter() - self.idle_from[e]

    def _resumed_on(self, e: int) -> list:
        """The interrupted prompts engine e takes now: a chunk of them; with loops of your own, every one it holds
        (its worker drives all its loops at once)."""
        if self.kind != OWN:
            return [self.resumed.popleft() for _ in range(min(self.chunk, len(self.resumed)))]
        mine = [it for it in self.resumed if it.home == e]
        self.resumed = deque(it for it in self.resumed if it.home != e)
        return mine

    def _fresh(self, i: int, e: int) -> Partial | AgentPartial | LoopPartial:
        if self.kind == OWN:
            return LoopPartial(i, self.rows[i], self.n, home=e)
        if self.kind == TURNS:
            return AgentPartial(i, self.rows[i], self.n)
        return Partial.fresh(i, self.rows[i]["input_ids"], self.n)

    def _collect(self, e: int) -> None:
        """An engine's finished call into the queue, a group per prompt (partial ones to go on later)."""
        import ray

        call = self.busy.pop(e)
        self.ready.difference_update(call.refs)
        self.idle_from[e] = time.perf_counter()
        n = self.n
        for ref, share in zip(call.refs, call.shares):
            if self.partial:
                got: Progress = ray.get(ref)
                self.gen_s = max(self.gen_s, got.secs)
                self.resumed.extend(got.going)
                for j, (index, versions) in enumerate(got.ended):
                    at, first, last = slice(j * n, (j + 1) * n), versions[0], versions[-1]
                    group = Group(index, got.rollout.rows(at), last, last - first, got.turns[at], got.records[at])
                    self.queue.put([group])
                continue
            ro, version, secs, turns, records = ray.get(ref)
            self.gen_s = max(self.gen_s, secs)
            for j, i in enumerate(share):
                at = slice(j * n, (j + 1) * n)
                self.queue.put([Group(i, ro.rows(at), version, 0, turns[at], records[at])])

    def _landed(self, ready: list) -> None:
        self.ready.update(ready)
        for e in [e for e, c in self.busy.items() if all(r in self.ready for r in c.refs)]:
            self._collect(e)

    def wait(self, others: list, step: int) -> list:
        """Keep the engines fed until one of `others` (or, with none, a generation) is done; `others` done."""
        import ray

        self.feed(step)
        generating = [r for c in self.busy.values() for r in c.refs if r not in self.ready]
        refs = list(others) + generating
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1)
        mine = set(generating)
        self._landed([r for r in ready if r in mine])
        return [r for r in ready if r not in mine]

    def in_flight(self) -> int:
        """Prompts started and not finished: generating, or interrupted and waiting to go on."""
        return sum(len(sh) for c in self.busy.values() for sh in c.shares) + len(self.resumed)

    def interrupt(self) -> None:
        """A sync is due: the partial-rollout calls in flight stop at their next token boundary (each worker takes
        the interrupt in a concurrency group of its own, beside the call generating)."""
        for e, call in self.busy.items():
            for w in self.engines[e]:
                w.interrupt.options(concurrency_group=CONTROL).remote(call.number)

    def settle(self) -> None:
        """Let the generations in flight finish (or stop, interrupted) and queue what they made."""
        import ray

        refs = [r for c in self.busy.values() for r in c.refs]
        if refs:
            ray.wait(refs, num_returns=len(refs))
            self._landed(refs)

    def pending(self) -> list[int]:
        """Prompts drawn and not trained: what a checkpoint keeps for the resumed run to generate first."""
        busy = [i for c in self.busy.values() for sh in c.shares for i in sh]
        return list(self.todo) + busy + [it.index for it in self.resumed] + self.queue.indices()

    # --- the trainer's side ---

    def take(self, version: int, step: int) -> tuple[list[Group] | None, float]:
        """The next update's groups (None when the run's prompts cannot fill another) and how long the trainer
        waited for them."""
        t0 = time.perf_counter()
        # engines free since the last sync start now, not after the update's batch has gone out to the trainer
        self.feed(step)
        while True:
            self.queue.drop_stale(version)
            groups = self.queue.take(self.required)
            if groups is not None:
                return groups, time.perf_counter() - t0
            if not self.busy and not self.more_to_generate():
                return None, time.perf_counter() - t0
            if not self.busy and not self.resumed and self.freshness.room(len(self.queue)) == 0:
                raise RuntimeError("fully async: the queue cannot fill an update and no generation may start")
            self.wait([], step)

    def staleness(self, groups: list[Group], version: int) -> dict:
        """verl's fully_async/count/* after taking `groups` to train with the weights of `version`."""
        stale = sum(version - g.version >= 1 for g in groups)
        self.stale_samples += stale
        self.stale_trajectories += stale * self.n
        return {
            "fully_async/count/stale_samples_processed": float(self.stale_samples),
            "fully_async/count/stale_trajectory_processed": float(self.stale_trajectories),
            "fully_async/count/dropped_stale_samples": float(self.queue.dropped),
            "fully_async/count/current_param_version": float(version),
        }

    def rollouter_idle(self, seconds: float) -> float:
        """The engines' share of `seconds` spent with nothing to generate, since the last call."""
        now, idle = time.perf_counter(), 0.0
        for e in range(len(self.idle_s)):
            if e not in self.busy:
                self.idle_s[e] += now - self.idle_from[e]
                self.idle_from[e] = now
            idle, self.idle_s[e] = idle + self.idle_s[e], 0.0
        return idle / (seconds * len(self.idle_s)) if seconds > 0 else 0.0


def version_step(
    s: Stream, step: int, start_update: Callable[[list, Rollout, list, int], list], after_update: Callable[[dict], None]
) -> dict | None:
    """Weight version `step`: up to trigger_parameter_sync_step updates, each on the next required prompts as soon
    as the queue holds them, then the weights to the engines; None when not one update could be made (the prompts ran
    out). start_update(rows, rollout, turns, local_step) starts an update on the training workers (turns: each
    sample's agent-loop fields, for the reward) and returns its futures; after_update(metrics) follows each update
    (the KL controller)."""
    import ray

    pool = s.pool
    version, t0 = step - 1, time.perf_counter()  # the weights the engines were last sent
    s.rollouter_idle(1.0)  # what the engines idled through before this version (validation, a checkpoint) counts not
    m = {}
    if pool.version != version:  # the first version of a run (or of a resumed one): the engines start from these
        pool.trained = version
        m.update(pool.push())
    results, waited, updates, lag = [], 0.0, 0, 0
    taken: list = []
    for local in range(1, s.trigger + 1):
        if s.updates >= s.planned:
            break
        groups, w = s.take(version, step)
        waited += w
        if groups is None:
            break
        s.updates += 1
        updates += 1
        m.update(s.staleness(groups, version))
        lag = max(lag, *(version - g.version for g in groups))
        taken += groups
        rows = [s.rows[g.index] for g in groups]
        turns = [t for g in groups for t in (g.turns or [{}] * s.n)]
        futures = start_update(rows, merge([g.rollout for g in groups], pool.pad_id), turns, local)
        left = list(futures)
        while left:
            done = s.wait(left, step)
            left = [f for f in left if f not in done]
        got = ray.get(futures)
        after_update(M.reduce(got))
        results += got
    if not results:
        return None
    if s.partial:
        s.interrupt()
    s.settle()
    pool.trained = step
    m.update(pool.push())
    s.freshness.new_version(s.in_flight(), len(s.queue))
    elapsed = time.perf_counter() - t0
    m.update(M.reduce(results))
    m.update(turn_metrics([r for g in taken for r in g.records]))  # the agent loop's, over the version's samples
    m.update(
        {
            "timing_s/gen": waited,
            "trainer/idle_ratio": waited / elapsed if elapsed > 0 else 0.0,
            "rollouter/idle_ratio": s.rollouter_idle(elapsed),
            "fully_async/count/updates": float(updates),
            "timing_s/rollout_gen": s.gen_s,  # the engines' own (the watchdog's measure of rollout_gen)
            "training/off_policy_steps": float(lag),  # the stalest sample of the version, in weight versions
        }
    )
    if s.partial and taken:  # verl's partial metrics over the version's updates
        partial = [g for g in taken if g.span > 0]
        m["fully_async/partial/total_partial_num"] = float(len(partial))
        m["fully_async/partial/partial_ratio"] = len(partial) / len(taken)
        m["fully_async/partial/max_partial_span"] = float(max((g.span for g in taken), default=0))
    return m
