"""A worker's engine with verl's agent loop in front of it, which every rollout goes through (as in verl): the rows
whose loop is tool_agent (their agent_name, else rollout.agent.default_agent_loop) talk with their tools to the
turn limits; single_turn_agent rows write one turn, which is one engine call for all of them; rows whose loop is one
of your own (agent/own_loops.py) run it, their generate calls batched. The ranks of a tensor-parallel engine agree
on every wave, since each engine call is one for all of them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..rollout.engines.base import Rollout, Sampling
from .interactions import load_interactions
from .loop import LoopLimits, ToolAgentLoop, Trajectory, pack
from .own_loops import OwnLoops, OwnTrajectory
from .sanity import SanityCheck
from .setup import agent_of, tool_schemas
from .tool_parser import PARSERS
from .tools import close_tools, load_tools
from .trace import Tracer

# verl's num_turns/* and the tool calls per sample (tool_call_counts/*), and the loop's seconds per sample in generation
# and in tool calls (timing_s/agent_loop/*): each sample's record has one value of each
RECORDED = (
    "num_turns",
    "tool_call_counts",
    "timing_s/agent_loop/generate_sequences",
    "timing_s/agent_loop/tool_calls",
)


def record(t: Trajectory) -> dict:
    """A sample's record: RECORDED, and what a loop of your own counts (OpenAIAgentMetrics.counters)."""
    out = dict(zip(RECORDED, (t.num_turns, t.tool_calls, t.gen_s, t.tool_s)))
    return {**out, **t.counters} if isinstance(t, OwnTrajectory) else out


def turn_metrics(records: list[dict]) -> dict:
    """The samples' records as min, max and mean of each (nothing for no samples), the counts summed."""
    out = {}
    for name in RECORDED if records else ():
        values = [r[name] for r in records]
        out.update({f"{name}/min": min(values), f"{name}/max": max(values), f"{name}/mean": sum(values) / len(values)})
    for r in records:
        for name, value in r.items():
            if name not in RECORDED:
                out[name] = out.get(name, 0.0) + value
    return out


@dataclass
class TurnStats:
    """A batch's samples as the loop ran them, row for row with its Rollout."""

    trajs: list[Trajectory]

    def extra_info(self) -> list[dict]:
        return [t.info() for t in self.trajs]

    def records(self) -> list[dict]:
        return [record(t) for t in self.trajs]

    def metrics(self) -> dict:
        return turn_metrics(self.records())


def check(tokenizer, cfg) -> SanityCheck | None:
    """multi_turn.tokenization_sanity_check_mode's check, with the template and tools the prompts were made with."""
    mode = cfg.actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode
    if mode == "disable":
        return None
    d = cfg.data
    return SanityCheck(tokenizer, mode, d.apply_chat_template_kwargs, tool_schemas(d.tool_config_path))


def interleaved(own: list[bool], ours: list[Trajectory], theirs: list[Trajectory], n: int) -> list[Trajectory]:
    """Both kinds' trajectories back in their rows' order (n per row); own[i]: row i ran a loop of your own."""
    out, a, b = [], iter(ours), iter(theirs)
    for o in own:
        source = b if o else a
        out += [next(source) for _ in range(n)]
    return out


class AgentRollout:
    def __init__(self, engine, tokenizer, cfg):
        r = cfg.actor_rollout_ref.rollout
        mt = r.multi_turn
        limits = LoopLimits(
            mt.max_assistant_turns,
            mt.max_user_turns,
            mt.max_parallel_calls,
            mt.max_tool_response_length,
            mt.tool_response_truncate_side,
            mt.tool_timeout,
            cfg.data.max_response_length,
        )
        tools = load_tools(mt.tool_config_path) if mt.tool_config_path else {}
        interactions = load_interactions(mt.interaction_config_path) if mt.interaction_config_path else {}
        self.engine, self.default = engine, r.agent.default_agent_loop
        # a format without a parser runs no tool_agent row (agent/setup.py refuses those at start, as verl would fail)
        self.tracer = Tracer(cfg, tokenizer)
        self.loop = ToolAgentLoop(
            tokenizer,
            limits,
            PARSERS.get(mt.format),
            tools,
            interactions,
            cfg.data.apply_chat_template_kwargs,
            self.tracer if self.tracer.on else None,
            check(tokenizer, cfg),
        )
        self.R, self.pad, self.prompt_key = cfg.data.max_response_length, tokenizer.pad_token_id, cfg.data.prompt_key
        self.own = OwnLoops.of(cfg, tokenizer, tools)

    def close(self) -> None:
        """Stop what the tools hold (their MCP servers; the process's exit stops them too). Safe to repeat."""
        close_tools(self.loop.tools)

    def start(self, rows: list[dict], n: int) -> list[Trajectory]:
        """n trajectories of each row (prompt i's at i*n .. i*n+n-1), their interactions started."""
        return self.loop.start(rows, n, [agent_of(r, self.default) for r in rows], self.prompt_key)

    def generate(
        self, rows: list[dict], n: int, sampling: Sampling | None = None, sync_follows: bool = False
    ) -> tuple[Rollout, TurnStats]:
        """n samples of each row (prompt i's at rows i*n .. i*n+n-1), every turn of each in its response."""
        names = [agent_of(r, self.default) for r in rows]
        own = [self.own is not None and self.own.runs(name) for name in names]
        ours = [r for r, o in zip(rows, own) if not o]
        # every rank of a tensor-parallel engine steps through the waves, rows or none, unless all run loops of your own
        trajs, reported = self._waves(ours, n, sampling) if ours or not any(own) else ([], True)
        if any(own):
            picked = [(r, name) for r, name, o in zip(rows, names, own) if o]
            theirs, logps = self.own.generate(self.engine, [r for r, _ in picked], [m for _, m in picked], n, sampling)
            trajs, reported = interleaved(own, trajs, theirs, n), reported and logps
        self.engine.rest(sync_follows)
        return self.finish(trajs, reported)

    def _waves(self, rows: list[dict], n: int, sampling: Sampling | None) -> tuple[list[Trajectory], bool]:
        """rlrig's own loops (single_turn_agent, tool_agent) over `rows`, wave by wave; whether the engine reported
        log-probs."""
        engine = self.engine
        trajs = self.start(rows, n)
        wave, reported = 0, True
        while engine.agree(any(not t.done for t in trajs)):
            live = [t for t in trajs if not t.done]
            t0 = time.time_ns()
            if wave == 0:  # each prompt's n samples in one call, sharing the prompt's prefill where the engine can
                ro = engine.generate([r["input_ids"] for r in rows], n, sampling, hold=True)
            else:
                contexts = [t.prompt + t.ids for t in live]
                ro = engine.generate(contexts, 1, sampling, max_new=self._budget(live), hold=True)
            ro = ro.to("cpu")  # read row by row below: one copy, not one per row
            reported = reported and ro.engine_logp is not None
            self._absorb(live, ro, ro.engine_logp, [True] * len(live), t0, time.time_ns())
            wave += 1
        return trajs, reported and wave > 0

    def finish(self, trajs: list[Trajectory], with_logps: bool = True) -> tuple[Rollout, TurnStats]:
        """Ended trajectories as one Rollout, their interactions finalized."""
        self.loop.finish([t for t in trajs if not isinstance(t, OwnTrajectory)])
        return pack(trajs, self.R, self.pad, with_logps), TurnStats(trajs)

    def go_on(self, trajs: list[Trajectory], stopped, logprobs) -> None:
        """The fully async mode's partial rollouts (verl's partial tool agent loop): every unfinished trajectory on
        under the current weights, wave by wave, until each ends or stopped() halts a wave at a token boundary. A turn
        halted that way stays open (Trajectory.turn) and goes on from its last token on the next call, maybe under
        newer weights; its tools run once it ends. The tool calls and interactions of the turns that ended in the
        halted wave still run before this returns, so an interrupted trajectory is always mid-generation, as verl's
        only ever are. logprobs(rollout): the current weights' log-probs of a rollout's response tokens, for an
        engine that reports none (each token's are those of the weights that drew it)."""
        engine = self.engine
        while engine.agree(any(not t.done for t in trajs) and not stopped()):
            live = [t for t in trajs if not t.done]
            t0 = time.time_ns()
            ro, ended = engine.generate_until([t.prompt + t.ids for t in live], self._budget(live), stopped)
            logp = ro.engine_logp if ro.engine_logp is not None else logprobs(ro)
            self._absorb(live, ro.to("cpu"), logp.cpu(), ended, t0, time.time_ns())

    def _budget(self, live: list[Trajectory]) -> int:
        return max((self.R - len(t.ids) for t in live), default=1)

    def _absorb(self, live: list[Trajectory], ro: Rollout, logp, ended: list[bool], start: int, end: int) -> None:
        """A wave's tokens (generated from `start` to `end`, in ns) into its trajectories, each cut to the response
        length; every turn that is over (the engine ended it, or the response is full) is checked, and its tool
        calls, or its interaction's turn, run."""
        loop, took = self.loop, (end - start) / 1e9
        # read to the host once for the wave, not a row at a time (a step's rows are many and their tokens few)
        ids, kept = ro.input_ids[:, ro.prompt_len :].tolist(), ro.response_mask.tolist()
        logps = logp.tolist() if logp is not None else None
        for i, t in enumerate(live):
            # the tokens up to and including an end token
            new = [tok for tok, k in zip(ids[i], kept[i]) if k][: self.R - len(t.ids)]
            if t.trace is not None:
                self.tracer.generation(t.trace, start, end, t.prompt + t.ids, new)
            drawn = None if logps is None else [x for x, k in zip(logps[i], kept[i]) if k][: len(new)]
            t.add(new, model=True, logps=drawn)
            routed = ro.routing_of(i)  # this call read the trajectory's every token before its last
            t.routed = routed[: len(t.prompt) + len(t.ids)] if routed is not None else t.routed
            t.turn += new
            t.gen_s += took
            if ended[i] or len(t.ids) >= self.R:
                turn, t.turn = t.turn, []
                loop.after_turn(t, turn)
        # a turn with tool calls goes to its tools, one without to its interaction (verl: tools first)
        loop.run_tools([t for t in live if not t.done and t.calls])
        loop.interact([t for t in live if not t.done and not t.calls and not t.turn and t.interaction is not None])
