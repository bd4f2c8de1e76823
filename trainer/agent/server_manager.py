"""The server_manager a loop of your own talks to (verl's LLMServerClient): its generate calls, from every loop of a
batch, gathered into one engine call per sampling.

The loops run as coroutines on one event loop. Whenever every loop still running waits on generate (the others have
ended), the calls waiting go to the engine together and each gets its TokenOutput; a loop awaiting something else (a
tool, a sleep) is waited for first. The ranks of a tensor-parallel engine run the same loops on the same rows, so
they make the same calls; engine.agree keeps them stepping together as the tool loop's waves do.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..rollout.engines.base import Sampling
from .verl_api import TokenOutput


@dataclass
class Request:
    prompt_ids: list[int]
    sampling: Sampling
    max_new: int
    answer: asyncio.Future


def failed(tasks: list[asyncio.Task]) -> list[asyncio.Task]:
    """The loops that raised (a loop that cancelled itself counts as one)."""
    return [t for t in tasks if t.done() and (t.cancelled() or t.exception() is not None)]


class ServerManager:
    """server_manager.generate for one batch of loops (verl's signature; images, videos and audio refused)."""

    def __init__(self, engine, base: Sampling, response_length: int, sampling_of):
        self.engine, self.base, self.R, self.sampling_of = engine, base, response_length, sampling_of
        self.waiting: list[Request] = []
        self.running = 0
        self.changed = asyncio.Event()
        self.calls = 0  # engine calls made
        self.services: dict[str, asyncio.Future] = {}

    async def service(self, key: str, start):
        """What the batch's loops share under `key` (an OpenAI endpoint): `await start()` on the first call, the same
        object after; its `aclose()` is awaited when the batch ends."""
        if key not in self.services:
            self.services[key] = asyncio.ensure_future(start())
        return await asyncio.shield(self.services[key])

    async def close_services(self) -> None:
        for made in self.services.values():
            if made.done() and not made.cancelled() and made.exception() is None:
                await made.result().aclose()
        self.services = {}

    async def generate(
        self,
        request_id=None,
        *,
        prompt_ids: list[int],
        sampling_params: dict,
        image_data=None,
        video_data=None,
        audio_data=None,
        **kwargs,
    ) -> TokenOutput:
        """The model's next turn after prompt_ids: at most sampling_params' max_tokens (else the response length)
        tokens, with their log-probs where the engine reports them."""
        if image_data or video_data or audio_data:
            raise ValueError("rlrig's agent loops are text only: generate got images, videos or audio")
        limit = sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens") or self.R
        req = Request(
            [int(t) for t in prompt_ids],
            self.sampling_of(sampling_params, self.base),
            int(limit),
            asyncio.get_running_loop().create_future(),
        )
        self.waiting.append(req)
        self.changed.set()
        return await req.answer

    def ended(self, _task=None) -> None:
        self.running -= 1
        self.changed.set()

    async def settled(self, tasks: list[asyncio.Task]) -> None:
        """Until every running loop waits on generate; the first loop to have failed is raised."""
        while len(self.waiting) < self.running and not failed(tasks):
            self.changed.clear()
            await self.changed.wait()
        bad = failed(tasks)
        if bad and bad[0].cancelled():
            raise RuntimeError("an agent loop of your own cancelled itself; a loop must return its output")
        if bad:
            raise bad[0].exception()

    def flush(self) -> None:
        """The waiting calls to the engine, one call per sampling, in the order they came."""
        waiting, self.waiting = self.waiting, []
        groups: dict[Sampling, list[Request]] = {}
        for req in waiting:
            groups.setdefault(req.sampling, []).append(req)
        for sampling, reqs in groups.items():
            max_new = max(r.max_new for r in reqs)
            ro = self.engine.generate([r.prompt_ids for r in reqs], 1, sampling, max_new=max_new, hold=True)
            ro = ro.to("cpu")
            self.calls += 1
            for i, r in enumerate(reqs):
                kept = ro.response_mask[i].bool()
                ids = ro.input_ids[i, ro.prompt_len :][kept].tolist()[: r.max_new]
                logps = ro.engine_logp[i][kept].tolist()[: len(ids)] if ro.engine_logp is not None else None
                r.answer.set_result(TokenOutput(token_ids=ids, log_probs=logps, stop_reason="completed"))

    async def drive(self, coroutines: list) -> list:
        """The loops to their ends, their generate calls batched; their outputs in order. The first loop to raise
        cancels the others and its exception is raised."""
        tasks = [asyncio.ensure_future(c) for c in coroutines]
        self.running = len(tasks)
        for t in tasks:
            t.add_done_callback(self.ended)
        try:
            while True:
                await self.settled(tasks)
                if not self.engine.agree(bool(self.waiting)):
                    break
                self.flush()
            return [t.result() for t in tasks]
        finally:
            for t in tasks:
                t.cancel()
            await self.close_services()
