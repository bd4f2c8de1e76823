"""A generative judge served over HTTP, as verl's reward loop serves a generative reward model to a reward function
of the user's (`reward_router_address`): POST /v1/chat/completions and /v1/completions (OpenAI's protocol), GET
/v1/models and /health. The engine is reward_model.rollout.name's (reward/judge_engines.py).

The server runs in a child process of its own, which dies with its parent (PR_SET_PDEATHSIG): a training worker's
(colocated) or a reward-pool worker's. Colocated on a GPU the engine sleeps except while the step scores
(POST /rlrig/wake, /rlrig/sleep); a child has its own CUDA context, so its sleep never touches the rollout
engine's memory. GET /rlrig/stats counts requests, tokens, failures and the engine's seconds.

Requests that arrive together are generated together: the server waits briefly after the first one of a batch
for the others (a step's reward function calls all come at once), up to rollout.max_num_seqs. Each request keeps
its own sampling (temperature, top_p, top_k, seed, max_tokens); n > 1 and streaming are refused; stop strings cut
the text where they first occur, as vLLM's do.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ..child_process import Child, child_env, die_with_parent
from .judge_engines import JudgeEngineError, JudgeOutput, JudgeRequest, JudgeSpec, make_judge_engine

GATHER_S = 0.02  # how long a batch waits for more requests after its last one arrived


class BadRequest(Exception):
    """A request the server refuses (HTTP 400) with the line the caller reads."""


def _number(body: dict, key: str, default, kind=float, low=None):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise BadRequest(f"{key} must be a number, not {v!r}")
    if low is not None and v < low:
        raise BadRequest(f"{key} must be at least {low}, not {v!r}")
    return kind(v)


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise BadRequest("message content must be text or text parts: the judge reads text only")


class JudgeApp:
    """The HTTP side of the server (see the module's docstring) over one engine."""

    def __init__(self, engine, tokenizer, spec: JudgeSpec):
        self.engine, self.tok, self.spec = engine, tokenizer, spec
        self.lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="judge-engine")  # one engine call at a time
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stats = dict(requests=0, batches=0, failures=0, prompt_tokens=0, completion_tokens=0, generate_s=0.0)
        self.model_name = spec.path

    def routes(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", lambda _: web.json_response({}))
        app.router.add_get("/rlrig/stats", lambda _: web.json_response(self.stats))
        app.router.add_post("/rlrig/wake", self.control(self.engine.wake))
        app.router.add_post("/rlrig/sleep", self.control(self.engine.sleep))
        return app

    def control(self, fn):
        async def handler(_):
            await asyncio.get_running_loop().run_in_executor(self.lane, fn)
            return web.json_response({})

        return handler

    async def models(self, _) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    def request(self, body: dict, prompt: list[int]) -> JudgeRequest:
        if body.get("n", 1) != 1:
            raise BadRequest("n must be 1: each call is one verdict")
        if body.get("stream"):
            raise BadRequest("stream is not supported by rlrig's judge server; call without stream")
        room = self.spec.max_model_len - len(prompt)
        if room < 1:
            raise BadRequest(
                f"the prompt is {len(prompt)} tokens; the judge takes {self.spec.max_model_len} "
                "(reward_model.rollout.max_model_len, or prompt_length + response_length)"
            )
        default = min(room, self.spec.rollout["response_length"])
        most = body.get("max_completion_tokens", body.get("max_tokens"))
        most = default if most is None else min(_number({"max_tokens": most}, "max_tokens", 0, int, 1), room)
        return JudgeRequest(
            tuple(prompt),
            most,
            _number(body, "temperature", 1.0, low=0),
            _number(body, "top_p", 1.0),
            _number(body, "top_k", -1, int),
            _number(body, "seed", None, int),
        )

    def chat_prompt(self, body: dict) -> list[int]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("messages must be a non-empty list")
        chat = []
        for m in msgs:
            if not isinstance(m, dict) or "role" not in m:
                raise BadRequest("each message must be an object with a role")
            chat.append({"role": m["role"], "content": _text(m.get("content"))})
        text = self.tok.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False, **(body.get("chat_template_kwargs") or {})
        )
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def completion_prompt(self, body: dict) -> list[int]:
        p = body.get("prompt")
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return p
        if isinstance(p, str) and p:
            return self.tok(p, add_special_tokens=False)["input_ids"]
        raise BadRequest("prompt must be a non-empty string or a list of token ids (one prompt per call)")

    async def chat(self, req: web.Request) -> web.Response:
        return await self.answer(req, self.chat_prompt, "chat.completion")

    async def completions(self, req: web.Request) -> web.Response:
        return await self.answer(req, self.completion_prompt, "text_completion")

    async def answer(self, req: web.Request, prompt_of, kind: str) -> web.Response:
        try:
            body = await req.json()
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            prompt = prompt_of(body)
            ask = self.request(body, prompt)
            stop = body.get("stop") or []
            stop = [stop] if isinstance(stop, str) else list(stop)
        except (BadRequest, ValueError) as e:
            return error(400, str(e))
        done = asyncio.get_running_loop().create_future()
        await self.queue.put((ask, done))
        try:
            out: JudgeOutput = await done
        except Exception as e:  # noqa: BLE001 - the engine's failure goes to the caller, whole
            return error(500, f"the judge's engine failed: {type(e).__name__}: {e}", "server_error")
        text = self.tok.decode(out.ids, skip_special_tokens=True)
        finish = out.finish_reason
        cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=None)
        if cut is not None:
            text, finish = text[:cut], "stop"
        usage = dict(prompt_tokens=len(prompt), completion_tokens=len(out.ids), total_tokens=len(prompt) + len(out.ids))
        self.stats["prompt_tokens"] += len(prompt)
        self.stats["completion_tokens"] += len(out.ids)
        choice = {"index": 0, "finish_reason": finish, "logprobs": None}
        if kind == "chat.completion":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return web.json_response(
            {
                "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
                "object": kind,
                "created": int(time.time()),
                "model": self.model_name,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def batches(self) -> None:
        """Forever: the requests that came together, generated together."""
        loop = asyncio.get_running_loop()
        most = self.spec.rollout["max_num_seqs"]
        while True:
            batch = [await self.queue.get()]
            while len(batch) < most:
                try:
                    batch.append(self.queue.get_nowait())
                except asyncio.QueueEmpty:
                    await asyncio.sleep(GATHER_S)
                    if self.queue.empty():
                        break
            self.stats["requests"] += len(batch)
            self.stats["batches"] += 1
            t = time.perf_counter()
            try:
                outs = await loop.run_in_executor(self.lane, self.engine.generate, [a for a, _ in batch])
            except Exception as e:  # noqa: BLE001 - every caller of the batch gets it
                self.stats["failures"] += len(batch)
                for _, done in batch:
                    if not done.done():  # a caller that hung up has cancelled its own
                        done.set_exception(e)
                continue
            finally:
                self.stats["generate_s"] += time.perf_counter() - t
            for (_, done), out in zip(batch, outs, strict=True):
                if not done.done():
                    done.set_result(out)

    async def run(self, conn, host: str) -> None:
        """Serve on host at a free port, tell the parent the port, and stop when the parent closes the pipe."""
        runner = web.AppRunner(self.routes(), access_log=None)
        await runner.setup()
        sock = socket.create_server((host, 0))  # the kernel's free port, bound before anyone is told it
        await web.SockSite(runner, sock).start()
        port = sock.getsockname()[1]
        batcher = asyncio.create_task(self.batches())
        conn.send(("ready", port))
        try:
            await asyncio.get_running_loop().run_in_executor(None, _until_closed, conn)
        finally:
            batcher.cancel()
            await runner.cleanup()
            self.engine.close()


def error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def _until_closed(conn) -> None:
    try:
        while True:
            conn.recv()
    except (EOFError, OSError):
        return


def serve(conn, spec: JudgeSpec, host: str, env: dict) -> None:
    """The child: build the engine and the judge's tokenizer, then serve until the parent is gone."""
    die_with_parent()
    os.environ.update(env)
    try:
        from transformers import AutoTokenizer

        engine = make_judge_engine(spec)
        trust = {"trust_remote_code": True} if spec.trust_remote_code else {}
        tok = AutoTokenizer.from_pretrained(spec.path, **trust)
    except JudgeEngineError as e:
        conn.send(("error", str(e)))
        return
    except Exception as e:  # noqa: BLE001 - the parent reports it as the reason the judge did not start
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    asyncio.run(JudgeApp(engine, tok, spec).run(conn, host))


class JudgeServer:
    """The judge's server process, started from reward_model.* (see the module's docstring): `address` is its
    host:port, what a reward function gets as reward_router_address."""

    def __init__(self, spec: JudgeSpec, host: str = "127.0.0.1"):
        self.child = Child(serve, (spec, host, child_env(spec.device)), "rlrig-judge")
        kind, value = self.child.recv()
        if kind != "ready":
            self.close()
            raise RuntimeError(
                f"reward_model.rollout.name={spec.rollout['name']}: the judge ({spec.path}) did not start: {value}"
            )
        self.address = f"{host}:{value}"

    def close(self) -> None:
        """Ends the server: it exits when the pipe closes, and is killed after 30 s."""
        self.child.close()
