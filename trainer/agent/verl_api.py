"""verl 0.9's agent-loop API (verl/experimental/agent_loop/agent_loop.py) for loops of your own, without verl.

A loop written for verl runs under rlrig by changing its import lines to this module: it subclasses AgentLoopBase,
registers a name with @register (or is named in rollout.agent.agent_loop_config_path), and its `async run(
sampling_params, **row)` calls `await self.server_manager.generate(request_id=..., prompt_ids=...,
sampling_params=...)` for each turn, which returns a TokenOutput (the new tokens and, where the engine reports them,
their log-probs), and returns an AgentLoopOutput. Where verl itself is importable, a loop subclassing verl's own
AgentLoopBase runs unchanged (agent/own_loops.py gives it the arguments verl gives).

The loop's response_mask decides what is trained on (1: the model's tokens); its reward_score, when set, is the
sample's score and the reward function is not called for it; its extra_fields reach the reward function's
extra_info; num_turns is the sample's num_turns/*. Text only: a loop that passes images, videos or audio is refused.
"""

from __future__ import annotations

import asyncio
import functools
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from .chat import Deltas, template_ids


class AgentLoopMetrics(BaseModel):
    """verl's per-sample timings: seconds in generation, in tool calls, in scoring."""

    generate_sequences: float = 0.0
    tool_calls: float = 0.0
    compute_score: float = 0.0
    num_preempted: int = -1  # -1: not available


class AgentLoopOutput(BaseModel):
    """What a loop returns for its sample: verl's fields (the multimodal ones must stay None: text only)."""

    prompt_ids: list[int]
    response_ids: list[int]  # every token after the prompt: the model's and the context the loop added
    response_mask: list[int]  # 1 for the model's own tokens (trained on), 0 for the rest; as long as response_ids
    response_logprobs: list[float] | None = None  # the engine's log-probs of response_ids (0 where mask is 0)
    routed_experts: Any | None = None
    multi_modal_data: dict[str, Any] | None = None
    reward_score: float | None = None  # set: the sample's score, the reward function not called
    num_turns: int = 0  # chat turns: user, assistant and tool
    metrics: AgentLoopMetrics
    extra_fields: dict[str, Any] = {}  # merged into the reward function's extra_info
    mm_processor_kwargs: dict[str, Any] | None = None
    mm_processor_output: list[dict[str, Any]] | None = None


class TokenOutput(BaseModel):
    """server_manager.generate's answer: the response tokens of one call and, where the engine reports them, their
    log-probs; stop_reason "completed"."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any | None = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = {}


class DictConfigWrap:
    """verl's wrapper of a config handed to a loop (its `.config`)."""

    def __init__(self, config):
        self.config = config


class ToolListWrap:
    """verl's wrapper of the tool list handed to a loop (its `.tools`)."""

    def __init__(self, tools: list):
        self.tools = tools


@dataclass
class MergeResult:
    """verl's continuous-token merge: the runtime token stream after an append."""

    token_ids: list[int]
    appended_token_count: int
    kind: str = "context"
    inserted_token_ids: list[int] = field(default_factory=list)
    removed_prefix_token_count: int = 0


@contextmanager
def simple_timer(name: str, timing: dict):
    """verl's timer: the block's seconds added to timing[name]."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def rollout_trace_op(fn):
    """verl's tracing decorator; rlrig traces its own loops only (agent/trace.py), so a loop's run is left as it is."""

    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        return await fn(*args, **kwargs)

    return wrapper


class AgentLoopBase(ABC):
    """A loop of your own, as verl's: constructed per sample with verl's keyword arguments (trainer_config,
    server_manager, tokenizer, processor, dataset_cls, data_config, hf_model_type, tools, and the config entry's own
    keys), then `await run(sampling_params, **row)` once. self.config is the run's config (attribute or .get access),
    self.rollout_config its actor_rollout_ref.rollout (with verl's prompt_length and response_length).

    The ct_* helpers are verl's token bookkeeping for text: the prompt through the chat template, the model's tokens
    appended as they came (never re-tokenized), added messages as the template writes them after the model's turn."""

    def __init__(
        self,
        trainer_config: DictConfigWrap,
        server_manager,
        tokenizer,
        processor=None,
        dataset_cls=None,
        data_config: DictConfigWrap | None = None,
        hf_model_type: str | None = None,
        **kwargs,
    ):
        self.config = trainer_config.config
        self.rollout_config = self.config.actor_rollout_ref.rollout
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.processor = processor
        self.dataset_cls = dataset_cls
        self.data_config = data_config.config if data_config is not None else self.config.data
        self.apply_chat_template_kwargs = dict(self.data_config.get("apply_chat_template_kwargs") or {})
        self.mm_processor_kwargs = {}
        self.loop = asyncio.get_event_loop()

    def _assert_mm_supported(self, has_multi_modal: bool) -> None:
        if has_multi_modal:
            raise ValueError("rlrig's agent loops are text only: the sample has images, videos or audio")

    def _get_mm_processor_kwargs(self, audio_data=None) -> dict:
        return {}

    async def process_vision_info(self, messages: list[dict]) -> dict:
        return {}

    async def process_multi_modal_info(self, messages: list[dict]) -> dict:
        return {}

    @staticmethod
    def build_sglang_video_payload(videos, mm_inputs: dict):
        return None

    async def ct_build_initial_tokens(self, messages: list[dict], tools: list[dict] | None = None, **_) -> list[int]:
        """The prompt's ids: the messages through the chat template with the generation prompt, its start cut to
        rollout.prompt_length."""
        ids = template_ids(self.tokenizer, messages, self.apply_chat_template_kwargs, tools)
        return self._cap_text_prompt_length(ids)

    async def ct_merge_context_msg(
        self, previous_messages, updated_messages, runtime_token_ids, response_mask, response_logprobs=None, tools=None
    ):
        """The messages added since previous_messages appended as the template writes them (mask 0)."""
        added = Deltas(self.tokenizer, self.apply_chat_template_kwargs)(updated_messages[len(previous_messages) :])
        merged = MergeResult(list(runtime_token_ids) + added, len(added))
        logps = None if response_logprobs is None else list(response_logprobs) + [0.0] * len(added)
        return merged, list(response_mask) + [0] * len(added), logps

    async def ct_merge_assistant_token(
        self, runtime_token_ids, assistant_token_ids, response_mask, response_logprobs=None, assistant_logprobs=None
    ):
        """The model's tokens appended as they came (mask 1, their log-probs)."""
        merged = MergeResult(list(runtime_token_ids) + list(assistant_token_ids), len(assistant_token_ids), "assistant")
        mask = list(response_mask) + [1] * len(assistant_token_ids)
        if response_logprobs is None:
            return merged, mask, None
        added = list(assistant_logprobs) if assistant_logprobs is not None else [0.0] * len(assistant_token_ids)
        return merged, mask, list(response_logprobs) + added

    def _cap_text_prompt_length(self, prompt_ids: list[int]) -> list[int]:
        limit = self.rollout_config.prompt_length
        return prompt_ids[-limit:] if len(prompt_ids) > limit else prompt_ids

    @abstractmethod
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        """One sample: sampling_params (temperature, top_p, top_k, repetition_penalty, logprobs) for
        server_manager.generate; kwargs: the data row's fields (raw_prompt: its messages; data_source, reward_model,
        extra_info, index, tools_kwargs, interaction_kwargs, ...)."""
        raise NotImplementedError


# name -> {"_target_": "pkg.module.Class", ...}: @register's and agent_loop_config_path's entries, as verl's
_agent_loop_registry: dict[str, dict] = {}


def register(agent_name: str):
    """A class decorator naming a loop, so rows with that agent_name (or default_agent_loop) run it."""

    def decorator(subclass: type) -> type:
        _agent_loop_registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
        return subclass

    return decorator
