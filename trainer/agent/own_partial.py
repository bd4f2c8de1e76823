"""Loops of your own across the fully async mode's weight syncs (async_training.partial_rollout, verl's partial agent
loops). A loop is a coroutine, which cannot travel between engines as rlrig's own trajectories do (agent/partial.py),
so it stays on the rollout worker that started it, on an event loop the worker keeps between calls. A sync halts
every engine call in flight at a token boundary: the call keeps the tokens it has, with the log-probs of the weights
that drew each, and goes on under the new weights when the driver next hands the worker its prompts; the loop sees one
generate call, answered once it ends. The driver sends a prompt back only to the engine that holds its loops
(LoopPartial.home, driver/fully_async.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..rollout.engines.base import Rollout, Sampling
from ..rollout.partial import Partial
from .own_loops import OwnLoops, sampling_of, sampling_params, trajectory
from .rollout import AgentRollout, TurnStats
from .server_manager import Request, ServerManager
from .verl_api import TokenOutput


@dataclass
class LoopPartial:
    """A prompt's n loops of your own in the making: its place in the data set, its row until its loops start, the
    engine holding them (set by the driver when it first sends the prompt), and the weight versions that drew its
    tokens."""

    index: int
    row: dict | None
    n: int
    home: int | None = None
    versions: list[int] = field(default_factory=list)
    finished: bool = False

    drawn_with = Partial.drawn_with


@dataclass
class Halted:
    """What a halted generate call has so far, beside its Request."""

    ids: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)


class HaltableServer(ServerManager):
    """server_manager.generate whose engine calls a weight sync may halt (engine.generate_until): a halted call stays
    waiting, with its tokens so far, and goes on in the next flush from its prompt and those tokens."""

    def __init__(self, engine, base, response_length: int, logprobs):
        super().__init__(engine, base, response_length, sampling_of)
        self.logprobs = logprobs  # the weights' log-probs of a rollout's response, for an engine that reports none
        self.so_far: dict[int, Halted] = {}  # by id(request)

    def flush_until(self, stopped) -> None:
        """The waiting calls to the engine, one call per sampling, until each ends or stopped() halts them."""
        waiting, self.waiting = self.waiting, []
        groups: dict[object, list[Request]] = {}
        for req in waiting:
            groups.setdefault(req.sampling, []).append(req)
        for sampling, reqs in groups.items():
            had = [self.so_far.setdefault(id(r), Halted()) for r in reqs]
            room = [r.max_new - len(h.ids) for r, h in zip(reqs, had)]
            contexts = [r.prompt_ids + h.ids for r, h in zip(reqs, had)]
            ro, ended = self.engine.generate_until(contexts, max(room), stopped, sampling)
            logp = ro.engine_logp if ro.engine_logp is not None else self.logprobs(ro)
            ro, logp = ro.to("cpu"), logp.cpu()
            self.calls += 1
            for i, (r, h) in enumerate(zip(reqs, had)):
                kept = ro.response_mask[i].bool()
                new = ro.input_ids[i, ro.prompt_len :][kept].tolist()[: room[i]]
                h.ids += new
                h.logps += logp[i][kept].tolist()[: len(new)]
                if ended[i] or len(h.ids) >= r.max_new:
                    del self.so_far[id(r)]
                    r.answer.set_result(TokenOutput(token_ids=h.ids, log_probs=h.logps, stop_reason="completed"))
                else:
                    self.waiting.append(r)

    async def drive_until(self, tasks: list[asyncio.Task], stopped) -> None:
        """The running loops on, their generate calls batched, until every one has ended or stopped() holds with
        every loop still running waiting on generate. The first loop to raise is raised (the run ends)."""
        while True:
            await self.settled(tasks)
            if not self.waiting or stopped():
                return
            self.flush_until(stopped)


class OwnPartials:
    """A rollout worker's loops of your own in flight across weight syncs: started, driven on until a sync halts
    them, and packed when a prompt's n loops have all returned. One event loop for the worker's life."""

    def __init__(self, agent: AgentRollout, own: OwnLoops, cfg, logprobs):
        self.agent, self.own, self.cfg = agent, own, cfg
        self.events = asyncio.new_event_loop()
        r = cfg.actor_rollout_ref.rollout
        base = Sampling.of(r)
        self.params = sampling_params(base, False)
        self.server = HaltableServer(agent.engine, base, cfg.data.max_response_length, logprobs)
        self.default = r.agent.default_agent_loop
        self.tasks: dict[int, tuple[str, list[asyncio.Task]]] = {}  # by prompt index: its loop's name, its n loops

    def go_on(self, items: list[LoopPartial], stopped, version: int) -> None:
        """Every prompt of `items` (started here if new) on under the weights of `version`; the worker's other
        prompts in flight go on too (the driver sends all of an engine's)."""
        self.events.run_until_complete(self._go_on(items, stopped))
        for it in items:
            it.drawn_with(version)
            it.finished = all(t.done() for t in self.tasks[it.index][1])

    async def _go_on(self, items: list[LoopPartial], stopped) -> None:
        from .setup import agent_of

        for it in (it for it in items if it.row is not None):
            name = agent_of(it.row, self.default)
            row, it.row = it.row, None  # the row rides no further trip
            tasks = [asyncio.ensure_future(self.own.run_one(self.server, name, row, self.params)) for _ in range(it.n)]
            self.tasks[it.index] = name, tasks
            self.server.running += it.n
            for t in tasks:
                t.add_done_callback(self.server.ended)
        await self.server.drive_until([t for _, ts in self.tasks.values() for t in ts], stopped)

    def packed(self, items: list[LoopPartial]) -> tuple[Rollout, TurnStats]:
        """Finished prompts' samples as one Rollout (prompt j's at rows j*n ..), their loops let go."""
        d = self.cfg.data
        made = []
        for it in items:
            name, tasks = self.tasks.pop(it.index)
            made += [trajectory(name, t.result(), d.max_prompt_length, d.max_response_length) for t in tasks]
        return self.agent.finish([t for t, _ in made], all(with_logps for _, with_logps in made))

    def close(self) -> None:
        """Cancel what is in flight and close the loops' shared services (an OpenAI endpoint); safe to repeat."""
        if self.events.is_closed():
            return
        for t in (t for _, ts in self.tasks.values() for t in ts):
            t.cancel()
        self.events.run_until_complete(self.server.close_services())
        self.events.close()
