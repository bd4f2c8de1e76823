"""A worker's engine with verl's agent loop in front of it, which every rollout goes through (as in verl): the rows
whose loop is tool_agent (their agent_name, else rollout.agent.default_agent_loop) talk with their tools to the
turn limits; single_turn_agent rows write one turn, which is one engine call for all of them. The ranks of a
tensor-parallel engine agree on every wave, since each engine call is one for all of them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..rollout.engines.base import Rollout, Sampling
from .interactions import load_interactions
from .loop import LoopLimits, ToolAgentLoop, Trajectory, pack
from .setup import agent_of
from .tool_parser import PARSERS
from .tools import load_tools


@dataclass
class TurnStats:
    """A batch's samples as the loop ran them, row for row with its Rollout."""

    trajs: list[Trajectory]

    def extra_info(self) -> list[dict]:
        return [t.info() for t in self.trajs]

    def metrics(self) -> dict:
        """verl's num_turns/* and the tool calls per sample (tool_call_counts/*), and the loop's seconds per sample in
        generation and in tool calls (timing_s/agent_loop/*)."""
        out = {}
        for name, values in (
            ("num_turns", [t.num_turns for t in self.trajs]),
            ("tool_call_counts", [t.tool_calls for t in self.trajs]),
            ("timing_s/agent_loop/generate_sequences", [t.gen_s for t in self.trajs]),
            ("timing_s/agent_loop/tool_calls", [t.tool_s for t in self.trajs]),
        ):
            if values:
                out.update({f"{name}/min": min(values), f"{name}/max": max(values)})
                out[f"{name}/mean"] = sum(values) / len(values)
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
        self.loop = ToolAgentLoop(
            tokenizer, limits, PARSERS.get(mt.format), tools, interactions, cfg.data.apply_chat_template_kwargs
        )
        self.R, self.pad, self.prompt_key = cfg.data.max_response_length, tokenizer.pad_token_id, cfg.data.prompt_key

    def generate(
        self, rows: list[dict], n: int, sampling: Sampling | None = None, sync_follows: bool = False
    ) -> tuple[Rollout, TurnStats]:
        """n samples of each row (prompt i's at rows i*n .. i*n+n-1), every turn of each in its response."""
        loop, engine = self.loop, self.engine
        trajs = loop.start(rows, n, [agent_of(r, self.default) for r in rows], self.prompt_key)
        wave, reported = 0, True
        while engine.agree(any(not t.done for t in trajs)):
            live = [t for t in trajs if not t.done]
            t0 = time.perf_counter()
            if wave == 0:  # each prompt's n samples in one call, sharing the prompt's prefill where the engine can
                ro = engine.generate([r["input_ids"] for r in rows], n, sampling, hold=True)
            else:
                budget = max((self.R - len(t.ids) for t in live), default=1)
                ro = engine.generate([t.prompt + t.ids for t in live], 1, sampling, max_new=budget, hold=True)
            ro = ro.to("cpu")  # read row by row below: one copy, not one per row
            took = time.perf_counter() - t0
            reported = reported and ro.engine_logp is not None
            for i, t in enumerate(live):
                kept = ro.response_mask[i].bool()  # the turn up to and including its end token
                turn = ro.input_ids[i, ro.prompt_len :][kept].tolist()[: self.R - len(t.ids)]
                logps = ro.engine_logp[i][kept].tolist()[: len(turn)] if ro.engine_logp is not None else None
                t.add(turn, model=True, logps=logps)
                t.gen_s += took
                loop.after_turn(t, turn)
            # a turn with tool calls goes to its tools, one without to its interaction (verl: tools first)
            tooling = [t for t in live if not t.done and t.calls]
            talking = [t for t in live if not t.done and not t.calls and t.interaction is not None]
            loop.run_tools(tooling)
            loop.interact(talking)
            wave += 1
        engine.rest(sync_follows)
        loop.finish(trajs)
        return pack(trajs, self.R, self.pad, reported and wave > 0), TurnStats(trajs)
