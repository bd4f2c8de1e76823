"""The OpenAI-compatible endpoint an OpenAI-client agent drives the run's engine through (agent/openai_agent.py).

One endpoint serves a batch of samples, on 127.0.0.1 at a free port, for as long as the batch runs: POST
/v1/chat/completions, POST /v1/completions and GET /v1/models. Each sample's agent gets its own key (the
`Authorization: Bearer` token); a call with any other key is refused, and a sample's key stops working when its
sample ends. Every call is one server_manager.generate call, so the calls of a batch's agents reach the engine
together, as a loop of your own's do.

A chat call's prompt is the model's own tokens where the agent sent its messages back as they came: when the
messages begin with the previous call's messages and the reply it got, the prompt is that call's prompt and
completion ids followed by the new messages as the chat template writes them after the model's turn (the tool
loop's deltas); otherwise the messages (and `tools`) through the chat template. Tool calls in the model's output
are parsed with the run's parser (multi_turn.format) into `tool_calls` when the request offers `tools`.

The run's sampling applies (the samples are trained at its temperature): the request's temperature, top_p and
seed are not used; max_tokens / max_completion_tokens are, within the sample's response budget (the run's
response length); n > 1, streaming and stop sequences are refused.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from .chat import Deltas, template_ids
from .openai_tokens import SampleTokens
from .tool_parser import HERMES


class RequestError(Exception):
    """A call the endpoint refuses: its HTTP status and the line the agent reads (OpenAI's error body)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclass
class LastCall:
    """A sample's previous chat call: what continues it at the message level."""

    messages: list[dict]
    tools: list | None
    ids: list[int]  # its prompt and completion
    reply: dict


@dataclass
class Session:
    """One sample's use of the endpoint: its key, its tokens and why it ended (None while it runs)."""

    key: str
    params: dict  # the loop's sampling_params
    tokens: SampleTokens = field(default_factory=SampleTokens)
    last: LastCall | None = None
    over_budget: bool = False
    busy: bool = False  # a call of it is being answered
    gen_s: float = 0.0  # seconds its calls waited for the engine
    generating_since: float | None = None  # perf_counter() when the call waiting now was made
    ended: str | None = None

    def own_s(self, start: float) -> float:
        """The agent's own seconds since `start`: everything but its calls' waits for the engine (which wait for
        the batch's other agents too)."""
        now = time.perf_counter()
        waiting = now - self.generating_since if self.generating_since is not None else 0.0
        return now - start - self.gen_s - waiting


def text_of(content) -> str:
    """A message's content as text (a list of text parts joined); images and audio refused."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise RequestError(400, "message content must be text or text parts: rlrig's rollouts are text only")


def arguments(raw):
    """A tool call's arguments as the chat template takes them (an object; a JSON string is parsed)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw
    return raw


def message(m) -> dict:
    """A request's message as the chat template reads it."""
    if not isinstance(m, dict) or "role" not in m:
        raise RequestError(400, "each message must be an object with a role")
    out = {"role": m["role"], "content": text_of(m.get("content"))}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": arguments(c["function"].get("arguments"))},
            }
            for c in m["tool_calls"]
        ]
    for k in ("tool_call_id", "name"):
        if m.get(k) is not None:
            out[k] = m[k]
    return out


def same_turn(a: dict, b: dict) -> bool:
    """Whether two messages are one turn (the ids of tool calls aside)."""
    calls = lambda m: [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
    return a["role"] == b["role"] and a["content"] == b["content"] and calls(a) == calls(b)


def positive(body: dict, *names: str) -> int | None:
    for name in names:
        v = body.get(name)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise RequestError(400, f"{name} must be a positive integer, not {v!r}")
            return v
    return None


def refuse_unsupported(body: dict) -> None:
    if body.get("n", 1) != 1:
        raise RequestError(400, "n must be 1: each call is one sample's turn")
    if body.get("stream"):
        raise RequestError(400, "stream is not supported by rlrig's endpoint; call without stream")
    if body.get("stop"):
        raise RequestError(
            400, "stop sequences are not supported by rlrig's endpoint; the model's turn ends at its end token"
        )


class Endpoint:
    """The endpoint for one batch of samples (see the module's docstring): open() a session per sample, end() it when
    the sample ends; start() before the first call, aclose() after the batch."""

    def __init__(self, manager, tokenizer, parse, template_kwargs: dict, budget: int):
        self.manager, self.tok, self.parse, self.budget = manager, tokenizer, parse, budget
        self.template_kwargs = dict(template_kwargs)
        self.deltas = Deltas(tokenizer, template_kwargs)
        self.eos = {tokenizer.eos_token_id} - {None}
        self.sessions: dict[str, Session] = {}
        self.runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self) -> Endpoint:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)  # loopback only: the agents run in this process
        await site.start()
        port = self.runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def aclose(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def open(self, params: dict) -> Session:
        s = Session(secrets.token_urlsafe(24), dict(params))
        self.sessions[s.key] = s
        return s

    def end(self, session: Session, why: str) -> None:
        session.ended = why

    # --- requests ---

    def session_of(self, request: web.Request) -> Session:
        auth = request.headers.get("Authorization", "")
        s = self.sessions.get(auth[len("Bearer ") :] if auth.startswith("Bearer ") else "")
        if s is None:
            raise RequestError(
                401, "invalid api key: use the key the agent was given for its sample", "authentication_error"
            )
        if s.ended is not None:
            raise RequestError(400, f"this sample has ended ({s.ended})")
        return s

    async def handle(self, request: web.Request, answer) -> web.Response:
        try:
            session = self.session_of(request)
            if session.busy:  # two calls at once would each continue the same context: no one sequence
                raise RequestError(400, "this sample has a call in flight: a sample's calls are made one at a time")
            session.busy = True
            try:
                return web.json_response(await answer(session, await self.body(request)))
            finally:
                session.busy = False
        except RequestError as e:
            error = {"message": str(e), "type": e.kind, "param": None, "code": None}
            return web.json_response({"error": error}, status=e.status)

    @staticmethod
    async def body(request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError(400, "the request body must be JSON") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        refuse_unsupported(body)
        return body

    async def chat(self, request: web.Request) -> web.Response:
        return await self.handle(request, self._chat)

    async def completions(self, request: web.Request) -> web.Response:
        return await self.handle(request, self._completion)

    async def models(self, request: web.Request) -> web.Response:
        try:
            self.session_of(request)
        except RequestError as e:
            return web.json_response({"error": {"message": str(e), "type": e.kind}}, status=e.status)
        return web.json_response({"object": "list", "data": [{"id": "rlrig", "object": "model", "owned_by": "rlrig"}]})

    def chat_prompt(self, session: Session, messages: list[dict], tools: list | None) -> list[int]:
        """The prompt's ids: the previous call's ids and the new messages' deltas where the messages continue it,
        else the messages through the chat template."""
        last, n = session.last, len(session.last.messages) if session.last else 0
        if (
            last is not None
            and last.tools == tools
            and len(messages) > n
            and all(same_turn(a, b) for a, b in zip(messages[:n], last.messages))
            and same_turn(messages[n], last.reply)
        ):
            new = messages[n + 1 :]
            return last.ids + (self.deltas(new) if new else [])
        return template_ids(self.tok, messages, self.template_kwargs, tools or None)

    async def _chat(self, session: Session, body: dict) -> dict:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise RequestError(400, "messages must be a non-empty list")
        tools = body.get("tools") or None
        if tools and self.parse is None:
            raise RequestError(400, "tools need a tool-call parser: set actor_rollout_ref.rollout.multi_turn.format")
        messages = [message(m) for m in raw]
        prompt = self.chat_prompt(session, messages, tools)
        ids, logps, finish = await self.generate(session, prompt, body)
        text, raw = self.tok.decode(ids, skip_special_tokens=True), self.tok.decode(ids, skip_special_tokens=False)
        reply: dict = {"role": "assistant", "content": text}
        calls = self.parse(raw) if tools else []
        if calls:
            reply["content"] = self.outside_calls(raw)
            reply["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
            finish = "tool_calls" if finish == "stop" else finish
        session.last = LastCall(messages, tools, prompt + ids, message(reply))
        choice = {"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}
        if body.get("logprobs") and logps is not None:
            choice["logprobs"] = {"content": self.token_logprobs(ids, logps)}
        return self.reply("chat.completion", body, choice, len(prompt), len(ids))

    async def _completion(self, session: Session, body: dict) -> dict:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids_in = self.tok(prompt, add_special_tokens=True)["input_ids"]
        elif (
            isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids_in = list(prompt)  # token ids: the exact context, nothing re-tokenized
        else:
            raise RequestError(400, "prompt must be one string or a list of token ids")
        ids, logps, finish = await self.generate(session, ids_in, body)
        choice = {"index": 0, "text": self.tok.decode(ids, skip_special_tokens=True), "finish_reason": finish}
        choice["logprobs"] = None
        if body.get("logprobs") is not None and logps is not None:
            choice["logprobs"] = {"tokens": [self.tok.decode([t]) for t in ids], "token_logprobs": list(logps)}
        return self.reply("text_completion", body, choice, len(ids_in), len(ids))

    async def generate(self, session: Session, prompt: list[int], body: dict) -> tuple[list[int], list | None, str]:
        """The model's turn after `prompt` within the sample's budget, recorded in its tokens: (ids, log-probs or None,
        finish_reason)."""
        room = session.tokens.room(prompt, self.budget)
        if room <= 0:
            session.over_budget = True
            raise RequestError(
                400, f"this sample's response budget ({self.budget} tokens, data.max_response_length) is spent"
            )
        asked = positive(body, "max_completion_tokens", "max_tokens")
        max_new = min(asked or room, room)
        session.generating_since = t0 = time.perf_counter()
        try:
            out = await self.manager.generate(
                request_id=uuid.uuid4().hex,
                prompt_ids=prompt,
                sampling_params={**session.params, "max_tokens": max_new},
            )
        finally:
            session.gen_s += time.perf_counter() - t0
            session.generating_since = None
        if session.ended is not None:  # the sample ended while the engine wrote this turn: it is not the sample's
            raise RequestError(400, f"this sample has ended ({session.ended})")
        ids = list(out.token_ids)
        session.tokens.add(prompt, ids, out.log_probs)
        cut = len(ids) >= max_new and not (ids and ids[-1] in self.eos)
        return ids, out.log_probs, "length" if cut else "stop"

    def outside_calls(self, raw: str) -> str:
        """The turn's text less its tool calls (hermes blocks, the one format rlrig parses) and special tokens: the
        tags may be special tokens, which a plain decode would drop, leaving the calls' JSON in the content."""
        text = HERMES.sub("", raw)
        for special in self.tok.all_special_tokens:
            text = text.replace(special, "")
        return text.strip()

    def token_logprobs(self, ids: list[int], logps: list[float]) -> list[dict]:
        return [
            {"token": self.tok.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(ids, logps)
        ]

    @staticmethod
    def reply(kind: str, body: dict, choice: dict, prompt_tokens: int, completion_tokens: int) -> dict:
        return {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": str(body.get("model") or "rlrig"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
