"""Tool calls in a model's turn, by multi_turn.format (verl's tool parsers). hermes, verl's default and Qwen's format:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "37*48"}}
    </tool_call>

A new format is one function here plus one entry in PARSERS."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class FunctionCall:
    """One call a parser found in the model's turn: the tool's name and its arguments. A parser is a function
    (the turn's text) -> [FunctionCall], in order, leaving out what it cannot read; PARSERS names each."""

    name: str
    arguments: str  # JSON, as the model wrote it (re-serialised)


HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def hermes(text: str) -> list[FunctionCall]:
    """Every complete <tool_call>...</tool_call> holding JSON with name and arguments; a malformed one is skipped (as
    verl's parser does: the model gets no response for it)."""
    calls = []
    for match in HERMES.findall(text):
        try:
            obj = json.loads(match)
            calls.append(FunctionCall(obj["name"], json.dumps(obj["arguments"], ensure_ascii=False)))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return calls


PARSERS = {"hermes": hermes}
