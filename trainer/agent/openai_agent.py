"""An agent written with any OpenAI client, driving the run's engine through an OpenAI-compatible endpoint.

It is an agent loop of your own, named in rollout.agent.agent_loop_config_path as verl's loops are, with the
agent in the entry's own keys:

    - name: calculator_agent
      _target_: rlrig.trainer.agent.openai_agent.OpenAIAgentLoop
      agent: my_package.my_module:solve        # or path/to/agent.py:solve
      timeout_s: 600                           # per sample (default 600)

Rows whose agent_name (else default_agent_loop) is the entry's name run the agent: for each sample,
`agent(base_url, api_key, row)` (sync or async), where base_url is the endpoint's (agent/openai_endpoint.py: /v1/chat
/completions and /v1/completions on 127.0.0.1), api_key the sample's own key, and row the data row's fields as a loop
of your own gets them, with its prompt's messages under "messages". It returns the sample's score (a number), or
None for the reward function to score the sample.

The sample is its calls' exact tokens (agent/openai_tokens.py): the model's tokens trained on, everything else
masked. An agent that raises, returns what is not a number, runs past timeout_s, or asks for more than the response
budget (data.max_response_length tokens) ends its sample only: the sample is what its calls recorded, scored by the
reward function (an agent over budget keeps the score it returns), and counted in agent/openai/failed, timed_out or
over_budget.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import numbers
import os
import threading
import time
from typing import Any

from ..errors import ConfigError
from .openai_endpoint import Endpoint, Session
from .tool_parser import PARSERS
from .verl_api import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput

DEFAULT_TIMEOUT_S = 600.0
OUTCOMES = ("failed", "timed_out", "over_budget")
_agents: dict[str, Any] = {}  # each agent function loaded once per process


def load_agent(spec, where: str = "") -> Any:
    """The function `module:function` or `path/to/file.py:function` names; where: the errors' opening words."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"{where}agent={spec!r} must name a function as module:function or path/to/file.py:function")
    if spec in _agents:
        return _agents[spec]
    module_path, _, name = spec.rpartition(":")
    try:
        if module_path.endswith(".py"):
            if not os.path.isfile(module_path):
                raise ConfigError(f"{where}agent={spec}: no such file {module_path}")
            module_name = f"rlrig_openai_agent_{abs(hash(os.path.abspath(module_path)))}"
            file_spec = importlib.util.spec_from_file_location(module_name, module_path)
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_path)
    except ConfigError:
        raise
    except Exception as e:
        line = (str(e).splitlines() or [""])[0]
        raise ConfigError(f"{where}agent={spec} cannot be imported ({type(e).__name__}: {line})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"{where}agent={spec}: {module_path} has no function {name}")
    _agents[spec] = fn
    return fn


def in_thread(fn, *args) -> asyncio.Future:
    """A sync agent's call on a thread of its own (a daemon: one past its time limit is left behind, its key revoked),
    its result on this event loop."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(value, error) -> None:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(value)

    def work() -> None:
        try:
            value, error = fn(*args), None
        except Exception as e:  # handed to the loop, which counts the sample as failed
            value, error = None, e
        except BaseException as e:  # SystemExit and the like end this sample, not the run
            value, error = None, RuntimeError(f"the agent raised {type(e).__name__}")
        try:
            loop.call_soon_threadsafe(settle, value, error)
        except RuntimeError:  # the batch is over and its event loop closed: nobody waits for this sample
            pass

    threading.Thread(target=work, name="openai-agent", daemon=True).start()
    return done


async def call_agent(fn, *args):
    out = fn(*args) if inspect.iscoroutinefunction(fn) else await in_thread(fn, *args)
    return await out if inspect.isawaitable(out) else out


class OpenAIAgentMetrics(AgentLoopMetrics):
    """verl's per-sample timings, and how the agent ended (counted over the batch in the step's metrics)."""

    failed: int = 0
    timed_out: int = 0
    over_budget: int = 0

    def counters(self) -> dict[str, float]:
        return {f"agent/openai/{k}": float(getattr(self, k)) for k in OUTCOMES}


class OpenAIAgentLoop(AgentLoopBase):
    """A loop whose sample an OpenAI-client agent drives (see the module's docstring); entry keys: agent (required),
    timeout_s."""

    def __init__(self, *args, agent: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, **kwargs):
        super().__init__(*args, **kwargs)
        self.check_entry("", {"agent": agent, "timeout_s": timeout_s})
        self.agent, self.timeout = load_agent(agent), float(timeout_s)
        self.multi_turn = self.rollout_config.multi_turn

    @classmethod
    def check_entry(cls, name: str, entry: dict) -> None:
        """The entry's keys checked at start-up (one line naming what is wrong)."""
        where = f"agent loop {name}: " if name else ""
        unknown = sorted(set(entry) - {"name", "_target_", "agent", "timeout_s"})
        if unknown:
            raise ConfigError(
                f"{where}{unknown[0]} is not a key of an OpenAI agent's entry (its keys: agent, timeout_s)"
            )
        if entry.get("agent") is None:
            raise ConfigError(
                f"{where}an OpenAI agent's entry needs agent: module:function (or path/to/agent.py:function)"
            )
        timeout = entry.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(f"{where}timeout_s={timeout!r} must be a positive number of seconds")
        load_agent(entry["agent"], where)

    async def endpoint(self) -> Endpoint:
        parse = PARSERS.get(self.multi_turn.format)
        made = Endpoint(
            self.server_manager,
            self.tokenizer,
            parse,
            self.apply_chat_template_kwargs,
            self.rollout_config.response_length,
        )
        return await made.start()

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        endpoint = await self.server_manager.service("openai", self.endpoint)
        session = endpoint.open(sampling_params)
        row = {**kwargs, "messages": [dict(m) for m in kwargs["raw_prompt"]]}
        self.messages = [dict(m) for m in kwargs["raw_prompt"]]
        start = time.perf_counter()
        outcome, score = "", None
        try:
            score = await self.watched(call_agent(self.agent, endpoint.base_url, session.key, row), session, start)
            if score is not None and (isinstance(score, bool) or not isinstance(score, numbers.Real)):
                outcome, score = "failed", None  # not a score: the sample is scored as a failed one
        except asyncio.TimeoutError:
            outcome = "timed_out"
        except Exception:
            outcome = "failed"
        if session.over_budget:
            outcome = "over_budget"
        endpoint.end(session, outcome or "returned")
        return await self.output(session, outcome, score, time.perf_counter() - start)

    async def watched(self, agent, session: Session, start: float):
        """The agent's result, or asyncio.TimeoutError once its own time (session.own_s) passes timeout_s. Its
        calls' waits for the engine do not count: they wait for the whole batch, a hanging agent's included."""
        task = asyncio.ensure_future(agent)
        try:
            while True:
                left = self.timeout - session.own_s(start)
                if left <= 0:
                    raise asyncio.TimeoutError
                done, _ = await asyncio.wait({task}, timeout=left)
                if done:
                    return task.result()
        finally:
            task.cancel()

    async def output(self, session: Session, outcome: str, score, took: float) -> AgentLoopOutput:
        t = session.tokens
        prompt = t.prompt or await self.ct_build_initial_tokens(self.messages)  # an agent that made no call
        R = self.rollout_config.response_length
        metrics = OpenAIAgentMetrics(
            generate_sequences=session.gen_s,
            tool_calls=max(0.0, took - session.gen_s),  # the agent's own time: its tools and its code
            **{k: int(outcome == k) for k in OUTCOMES},
        )
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=t.ids[:R],
            response_mask=t.mask[:R],
            response_logprobs=t.logps[:R] if t.with_logps else None,
            reward_score=None if score is None else float(score),
            num_turns=2 * t.calls if t.calls else 1,  # the prompt, then a model's turn and what followed it
            metrics=metrics,
            extra_fields={"agent_outcome": outcome or "returned", "agent_calls": t.calls},
        )
