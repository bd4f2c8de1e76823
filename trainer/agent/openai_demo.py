"""The embedded demonstration of an OpenAI-client agent (`rlrig train --preset openai-agent`): the calculator task
(two-digit products) solved by an agent written with the `openai` package, as one would write it for any OpenAI
server. It offers the model a calculator, runs the calls the model makes, sends the results back and asks again, up to
MAX_TURNS turns; its score is whether the final answer (`#### N`) is the product.

Named in an agent_loop_config_path entry (trainer/config/presets.py writes it):

    - name: calculator_agent
      _target_: rlrig.trainer.agent.openai_agent.OpenAIAgentLoop
      agent: rlrig.trainer.agent.openai_demo:solve
"""

from __future__ import annotations

import json
import re
import threading

from openai import OpenAI

from .tools.calculator import evaluate, shown

MAX_TURNS = 2
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 37*48"}},
            "required": ["expression"],
        },
    },
}
ANSWER = re.compile(r"####\s*(-?[\d,.]+)")


def calculate(arguments: str) -> str:
    try:
        return shown(evaluate(str(json.loads(arguments)["expression"])))
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        return f"error: {e}"


_clients: dict[str, OpenAI] = {}  # one client per endpoint, its connections shared by the samples' agents


_lock = threading.Lock()  # the samples' agents run on threads of their own


def client_for(base_url: str, api_key: str) -> OpenAI:
    with _lock:
        if base_url not in _clients:
            _clients.clear()  # each batch has an endpoint of its own: the last one's is done with
            _clients[base_url] = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        return _clients[base_url].with_options(api_key=api_key)


def solve(base_url: str, api_key: str, row: dict) -> float:
    """One sample: the row's question to the model with the calculator offered, its calls run, its answer scored."""
    client = client_for(base_url, api_key)
    messages = list(row["messages"])
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="rlrig", messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    found = ANSWER.findall(messages[-1].get("content") or "") if messages[-1]["role"] == "assistant" else []
    truth = str(row["reward_model"]["ground_truth"])
    return float(bool(found) and found[-1].replace(",", "").rstrip(".") == truth)
