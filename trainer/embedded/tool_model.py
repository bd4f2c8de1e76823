"""The embedded tool task: two-digit products, which the tiny model cannot work out, and a calculator it can call.

Its tokenizer is the embedded character-level one plus the pieces of a hermes tool call and of a tool response as
single tokens, and a chat template that writes tool messages as <tool_response>...</tool_response>, ends the model's
turns with the end token and, where the prompt offers tools, starts with <tools>. A call decodes to what verl's hermes
parser reads:

    <tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>

A short supervised warm-up on traces of both kinds (half answer directly, almost always wrongly; half call the
calculator and copy its result) leaves a model that calls it about half the time and copies well; RL, which pays for
right answers, then teaches it to call it every time. Everything is seeded and built offline, like the embedded
model.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from .tiny_model import build_tokenizer, cache_dir, save_atomically, supervised_step

VERSION = "tiny-tools-v2"  # v2: assistant turns end with the end token in the template; byte-level token names
CALL_OPEN = '{"name": "calculator", "arguments": {"expression": "'
CALL_CLOSE = '"}}'
PIECES = ["<tools>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", CALL_OPEN, CALL_CLOSE]
CHAT_TEMPLATE = (
    "{% if tools %}<tools>{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<tool_response>{{ m['content'] }}</tool_response>"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}{% endif %}"
    "{% endfor %}"
)
WARMUP_STEPS = int(os.environ.get("RLRIG_TOOL_WARMUP_STEPS", "2000"))  # about 90 s on one core, once
WARMUP_LR = 1e-3
DIRECT_SHARE = 0.5  # of the warm-up traces: answered without the calculator


def model_dir() -> Path:
    return cache_dir().parent / VERSION


def build_tool_tokenizer():
    from tokenizers import AddedToken

    tok = build_tokenizer()
    tok.add_tokens([AddedToken(p, special=False, normalized=False) for p in PIECES])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def problem(rng: random.Random) -> tuple[int, int]:
    return rng.randint(10, 99), rng.randint(10, 99)


def call_text(a: int, b: int) -> str:
    return f"<tool_call>{CALL_OPEN}{a}*{b}{CALL_CLOSE}</tool_call>"


def trace(a: int, b: int, direct: bool, eos: str) -> tuple[str, str]:
    """(the prompt as the template writes it with tools, the whole response with its end tokens)."""
    prompt = f"<tools>{a}*{b}="
    if direct:
        return prompt, f"#### {a * b}{eos}"
    return prompt, f"{call_text(a, b)}{eos}<tool_response>{a * b}</tool_response>#### {a * b}{eos}"


def calculator_rows(n: int, split: str, seed: int, agent: str = "tool_agent") -> list[dict]:
    """Products of two two-digit numbers in verl's schema, each row running the agent loop named `agent` (verl's tool
    agent loop unless told)."""
    from ..data.datasets import _row

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = problem(rng)
        q = f"{a}*{b}="
        row = _row("rlrig/calculator", q, str(a * b), split, i, q, f"#### {a * b}")
        rows.append({**row, "agent_name": agent})
    return rows


def warm_up(model, tokenizer, steps: int, seed: int = 0) -> None:
    """Supervised on whole traces, the prompt and the tool's response left out of the loss (as RL will leave them)."""
    import torch

    rng = random.Random(seed + 2000)
    opt = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR)
    model.train()
    response_open = tokenizer.convert_tokens_to_ids("<tool_response>")
    response_close = tokenizer.convert_tokens_to_ids("</tool_response>")
    for _ in range(steps):
        ids, labels = [], []
        traces = [trace(*problem(rng), rng.random() < DIRECT_SHARE, tokenizer.eos_token) for _ in range(32)]
        # a call for each side of the batch, not one per text: the tokenizer's own cost is most of a call's
        prompts, responses = (tokenizer(list(side), add_special_tokens=False)["input_ids"] for side in zip(*traces))
        for p, r in zip(prompts, responses):
            # the tool's tokens are not the model's to learn: from <tool_response> up to, not including, the next turn
            masked, inside = [], False
            for t in r:
                inside = inside or t == response_open
                masked.append(-100 if inside else t)
                inside = inside and t != response_close
            ids.append(p + r)
            labels.append([-100] * len(p) + masked)
        supervised_step(model, opt, ids, labels, tokenizer.pad_token_id)
    model.eval()


def ensure_tool_model(path: Path | None = None) -> str:
    """Build (once) and return the directory of the embedded tool model."""
    from .tiny_model import build_model

    path = path or model_dir()
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return str(path)
    tok = build_tool_tokenizer()
    model = build_model(tok, max_positions=128)  # a whole trace is about 40 tokens
    warm_up(model, tok, WARMUP_STEPS)
    return save_atomically(path, model, tok)


TOOL_CONFIG = """tools:
  - class_name: rlrig.trainer.agent.tools.calculator.CalculatorTool
    config: {type: native}
"""


def task_files(agent: str = "tool_agent") -> tuple[str, str, str]:
    """The task's training and test rows (run by the agent loop named `agent`) and its tool config, written once (as
    `rlrig data calculator` would) so the run reads them like any user's files."""
    from ..data.datasets import write_parquet

    root = cache_dir().parent / "data" / ("calculator-v1" if agent == "tool_agent" else f"calculator-v1-{agent}")
    train, test, tools = root / "train.parquet", root / "test.parquet", root / "calculator_tool_config.yaml"
    if not (train.is_file() and test.is_file() and tools.is_file()):
        root.mkdir(parents=True, exist_ok=True)
        for path, rows in (
            (train, calculator_rows(2048, "train", 1, agent)),
            (test, calculator_rows(64, "test", 2, agent)),
        ):
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            write_parquet(rows, tmp)
            os.replace(tmp, path)
        tmp = tools.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(TOOL_CONFIG)
        os.replace(tmp, tools)
    return str(train), str(test), str(tools)


MCP_TOOL_CONFIG = """tools:
  - class_name: verl.tools.mcp_base_tool.MCPBaseTool
    config: {{type: mcp, timeout: 30}}
    mcp:
      mcp_servers_config_path: {servers}
"""


def mcp_tool_config() -> str:
    """A tool config whose calculator is the MCP server agent/tools/calculator_server.py, started over stdio by each
    process that loads it with this Python; rewritten when the Python differs (another environment)."""
    import json
    import sys

    root = cache_dir().parent / "data" / "calculator-mcp"
    servers, tools = root / "mcp_servers.json", root / "calculator_mcp_tool_config.yaml"
    command = {"command": sys.executable, "args": ["-m", "rlrig.trainer.agent.tools.calculator_server"]}
    texts = {
        servers: json.dumps({"mcpServers": {"calculator": command}}, indent=2) + "\n",
        tools: MCP_TOOL_CONFIG.format(servers=json.dumps(str(servers))),
    }
    root.mkdir(parents=True, exist_ok=True)
    for path, text in texts.items():
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, path)
    return str(tools)
