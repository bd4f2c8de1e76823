"""verl's tool agent loop (verl/experimental/agent_loop/tool_agent_loop.py) over rlrig's batched engines.

verl runs each sample as its own coroutine against a token-in/token-out server; here the samples move in waves: each
wave, every sample still going writes one turn (one engine call for all of them), then the tool calls of all of them
run concurrently, then the interactions answer. A sample's turns, limits and tokens are what verl's loop gives it;
only the timing differs.

A sample's response is every turn after the prompt: the model's tokens (mask 1) and the tool and user messages
between them (mask 0, log-prob 0), cut to data.max_response_length. After each turn, in verl's order: the response
length, max_assistant_turns, max_user_turns end it; tool calls go to the tools; else an interaction answers; else it
ends. A tool round or an interaction reply is one user turn; num_turns = user turns + assistant turns + 1.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError
from ..rollout.engines.base import Rollout, left_pad, routed_layout
from .chat import Deltas
from .interactions import BaseInteraction
from .sanity import SanityCheck
from .tool_parser import FunctionCall
from .tools import BaseTool
from .tools.mcp import ToolServerError
from .trace import SampleTrace, Tracer

TOOL_AGENT, SINGLE_TURN = "tool_agent", "single_turn_agent"
LOOP_NAMES = {True: "ToolAgentLoop", False: "SingleTurnAgentLoop"}  # verl's classes, the traces' span names


@dataclass(frozen=True)
class LoopLimits:
    """multi_turn.* as the loop reads them (0 or None: no limit, as verl)."""

    max_assistant_turns: int | None
    max_user_turns: int | None
    max_parallel_calls: int
    max_tool_response_length: int
    truncate_side: str
    tool_timeout: float
    response_length: int


@dataclass
class Trajectory:
    """One sample on its way: verl's AgentData."""

    prompt: list[int]
    messages: list[dict]
    tools_kwargs: dict
    multi_turn: bool  # tool_agent (else single_turn_agent: one turn)
    interaction: BaseInteraction | None = None
    interaction_kwargs: dict = field(default_factory=dict)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    ids: list[int] = field(default_factory=list)  # the response so far
    mask: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    assistant_turns: int = 0
    user_turns: int = 0
    turn_scores: list[float] = field(default_factory=list)
    tool_rewards: list[float] = field(default_factory=list)
    tool_calls: int = 0
    gen_s: float = 0.0
    tool_s: float = 0.0
    calls: list[FunctionCall] = field(default_factory=list)  # the last turn's, waiting to run
    turn: list[int] = field(default_factory=list)  # a turn a weight sync halted (a partial rollout): its tokens so far
    trace: SampleTrace | None = None  # its rollout trace's spans (agent/trace.py), if it is traced
    # the engine's routed experts over prompt + ids [tokens, layers, k], from its latest turn (which read every token
    # before it), as verl's tool agent loop keeps them; None where the engine records none
    routed: torch.Tensor | None = None
    done: bool = False

    @property
    def num_turns(self) -> int:
        return self.user_turns + self.assistant_turns + 1

    def add(self, ids: list[int], model: bool, logps: list[float] | None = None) -> None:
        self.ids += ids
        self.mask += [int(model)] * len(ids)
        self.logps += logps if logps is not None else [0.0] * len(ids)

    def info(self) -> dict:
        """What the reward function finds in extra_info beside the row's own (verl's tool_extra_fields)."""
        return {"turn_scores": self.turn_scores, "tool_rewards": self.tool_rewards, "num_turns": self.num_turns}


def gathered(coroutines) -> list:
    """The coroutines run concurrently to completion, their results in order; no event loop made for none. The loop's
    callers are plain threads (a Ray actor's), so each batch of tool, interaction or start-up calls gets one loop."""
    coroutines = list(coroutines)

    async def run_all():
        return await asyncio.gather(*coroutines)

    return asyncio.run(run_all()) if coroutines else []


def truncated(text: str, limit: int, side: str) -> str:
    """verl's cut of a long tool response to `limit` characters, with verl's names for the sides: left keeps the start
    (the cut is on the right), right keeps the end, anything else keeps both ends."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    return text[: limit // 2] + "...(truncated)..." + text[-limit // 2 :]


async def timed(coroutine) -> tuple:
    """(the coroutine's result, when it started, when it ended), in nanoseconds since the epoch."""
    start = time.time_ns()
    out = await coroutine
    return out, start, time.time_ns()


async def call_tool(tool: BaseTool | None, call: FunctionCall, tools_kwargs: dict, timeout: float):
    """One call, on a fresh instance of its tool; any failure (an unknown tool, arguments that are not JSON, the
    tool raising or running past the timeout) is the text the model reads back, as in verl, never an error of the
    run, unless the tool's MCP server is gone (ToolServerError). (the text, the call's reward or None)"""
    instance = None
    try:
        if tool is None:
            raise KeyError(call.name)
        args = json.loads(call.arguments)
        create_kwargs = tools_kwargs.get(call.name, {}).get("create_kwargs", {})
        instance, _ = await asyncio.wait_for(tool.create(create_kwargs=create_kwargs), timeout)
        response, reward, _ = await asyncio.wait_for(tool.execute(instance, args), timeout)
    except TimeoutError:
        return f"Error when executing tool: timed out after {timeout:g} s", 0.0
    except ToolServerError:
        raise
    except Exception as e:  # the model's call, not the run, failed: it reads why, as in verl
        return f"Error when executing tool: {e}", 0.0
    finally:
        if instance is not None:
            await tool.release(instance)
    if response.image or response.video:
        raise ConfigError(f"tool {call.name} returned an image or video; rlrig's rollouts are text only")
    return response.text or "", reward


class ToolAgentLoop:
    """The loop for one worker's engine: tools and interactions made once from their config files, every batch of
    rows run through it."""

    def __init__(
        self,
        tokenizer,
        limits: LoopLimits,
        parse,
        tools: dict,
        interactions: dict,
        template_kwargs: dict,
        tracer: Tracer | None = None,
        check: SanityCheck | None = None,
    ):
        self.tok, self.limits, self.parse = tokenizer, limits, parse
        self.tools, self.interactions = tools, interactions
        self.deltas = Deltas(tokenizer, template_kwargs)
        self.tracer, self.check = tracer, check

    def start(self, rows: list[dict], n: int, agent_names: list[str], prompt_key: str) -> list[Trajectory]:
        """Each row's n trajectories, with their interactions started (and their traces, where traced)."""
        out = []
        for row, name in zip(rows, agent_names):
            extra = row.get("extra_info") or {}
            for _ in range(n):
                t = Trajectory(
                    list(row["input_ids"]),
                    list(row[prompt_key]),
                    dict(extra.get("tools_kwargs") or {}),
                    name == TOOL_AGENT,
                )
                if t.multi_turn and self.interactions:
                    t.interaction_kwargs = dict(extra.get("interaction_kwargs") or {})
                    t.interaction = self._interaction(t.interaction_kwargs)
                out.append(t)
        if self.tracer is not None:
            for t, trace in zip(out, self.tracer.chosen(rows, n)):
                t.trace = trace
                if trace is not None:
                    trace.inputs = {"raw_prompt": list(t.messages), "tools_kwargs": t.tools_kwargs}
        gathered(
            t.interaction.start_interaction(t.request_id, **t.interaction_kwargs)
            for t in out
            if t.interaction is not None
        )
        return out

    def _interaction(self, kwargs: dict) -> BaseInteraction:
        name = kwargs.get("name")
        if name is None:
            raise ConfigError(
                "multi_turn.interaction_config_path is set and a row's extra_info.interaction_kwargs has no name; "
                f"name one of {sorted(self.interactions)}"
            )
        if name not in self.interactions:
            raise ConfigError(
                f"a row's interaction_kwargs.name={name} is not in the interaction config's {sorted(self.interactions)}"
            )
        return self.interactions[name]

    def after_turn(self, t: Trajectory, turn: list[int]) -> None:
        """verl's checks after a generation, in its order; then the turn's tool calls, or the interaction's turn."""
        L = self.limits
        t.assistant_turns += 1
        if t.multi_turn:  # verl gives it to interactions; the sanity check templates the whole conversation
            t.messages.append({"role": "assistant", "content": self.tok.decode(turn, skip_special_tokens=True)})
        if (
            not t.multi_turn
            or len(t.mask) >= L.response_length
            or (L.max_assistant_turns and t.assistant_turns >= L.max_assistant_turns)
            or (L.max_user_turns and t.user_turns >= L.max_user_turns)
        ):
            t.done = True
            return
        start = time.time_ns()
        t.calls = self.parse(self.tok.decode(turn, skip_special_tokens=False))
        if t.trace is not None:
            self.tracer.parse(t.trace, start, time.time_ns(), turn, t.calls)
        t.done = not t.calls and t.interaction is None

    def run_tools(self, waiting: list[Trajectory]) -> None:
        """Every waiting trajectory's calls (the first max_parallel_calls of each turn), all at once."""
        L = self.limits
        jobs = [(t, c) for t in waiting for c in t.calls[: L.max_parallel_calls]]
        t0 = time.perf_counter()
        results = gathered(timed(call_tool(self.tools.get(c.name), c, t.tools_kwargs, L.tool_timeout)) for t, c in jobs)
        took = time.perf_counter() - t0
        replies: dict[int, list[dict]] = {id(t): [] for t in waiting}
        for (t, c), ((text, reward), start, end) in zip(jobs, results):
            if t.trace is not None:
                self.tracer.tool_call(t.trace, self.tools.get(c.name), c, start, end, text, reward)
            replies[id(t)].append(
                {"role": "tool", "content": truncated(text, L.max_tool_response_length, L.truncate_side)}
            )
            if reward is not None:
                t.tool_rewards.append(reward)
        for t in waiting:
            t.tool_s += took
            t.tool_calls += len(replies[id(t)])
            t.messages += replies[id(t)]
            delta = self.deltas(replies[id(t)])
            t.calls = []
            if len(t.mask) + len(delta) >= L.response_length:  # verl: no room for the responses, the sample ends
                t.done = True
                continue
            t.add(delta, model=False)
            t.user_turns += 1

    def interact(self, waiting: list[Trajectory]) -> None:
        replies = gathered(
            t.interaction.generate_response(t.request_id, t.messages, **t.interaction_kwargs) for t in waiting
        )
        for t, (stop, text, score, _) in zip(waiting, replies):
            t.user_turns += 1
            message = {"role": "user", "content": text}
            t.messages.append(message)
            if score is not None:
                t.turn_scores.append(score)
            t.add(self.deltas([message]), model=False)  # verl checks no length here: the final cut does
            t.done = bool(stop)

    def finish(self, trajs: list[Trajectory]) -> None:
        """Ended trajectories: their interactions finalized, their tokens checked against their conversations, their
        traces written."""
        gathered(t.interaction.finalize_interaction(t.request_id) for t in trajs if t.interaction is not None)
        if self.check is not None:
            self.check([(t.prompt + t.ids, t.messages) for t in trajs if t.multi_turn])
        if self.tracer is not None:
            self.tracer.write([(t.trace, LOOP_NAMES[t.multi_turn], self._outputs(t)) for t in trajs])

    def _outputs(self, t: Trajectory) -> dict:
        out = {"prompt_ids": t.prompt, "response_ids": t.ids, "response_mask": t.mask, "num_turns": t.num_turns}
        if self.tracer.token2text:
            out.update(prompt_text=self.tok.decode(t.prompt), response_text=self.tok.decode(t.ids))
        return out


def pack(trajs: list[Trajectory], response_length: int, pad_id: int, with_logps: bool) -> Rollout:
    """The trajectories as one Rollout: prompts left-padded, responses (every turn) right-padded to the response
    length; attention on every token of them, the response mask on the model's own."""
    ids, mask = left_pad([t.prompt for t in trajs], pad_id)
    R = response_length

    def right_padded(rows: list[list], value, dtype) -> torch.Tensor:
        # one tensor from padded lists: a tensor a row costs more than the rows' few tokens
        return torch.tensor([r[:R] + [value] * (R - len(r[:R])) for r in rows], dtype=dtype).reshape(len(rows), R)

    resp = right_padded([t.ids for t in trajs], pad_id, torch.long)
    attn = right_padded([[1] * len(t.ids) for t in trajs], 0, torch.long)
    rmask = right_padded([t.mask for t in trajs], 0, torch.long)
    logp = right_padded([t.logps for t in trajs], 0.0, torch.float32)
    attention = torch.cat([mask, attn], 1)
    routed = routed_layout([getattr(t, "routed", None) for t in trajs], attention)  # loops of your own record none
    return Rollout(
        torch.cat([ids, resp], 1), attention, rmask, ids.shape[1], logp * rmask if with_logps else None, routed
    )
