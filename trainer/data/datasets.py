"""Parquet data in verl's GSM8K schema: the offline arithmetic generator, GSM8K preprocessing, loading."""

from __future__ import annotations

import random
from pathlib import Path

from ..errors import ConfigError

GSM8K_SUFFIX = 'Let\'s think step by step and output the final answer after "####".'


def _row(data_source: str, content: str, answer: str, split: str, index: int, question: str, full_answer: str) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": full_answer, "question": question},
    }


def arithmetic_rows(n: int, split: str, seed: int, max_operand: int = 9, instruct: bool = False) -> list[dict]:
    """Sums `a+b=`; the answer is written `#### a+b` as in GSM8K. `instruct` asks in words with GSM8K's
    instruction, for a pretrained chat model (the bare form suits the embedded model's tiny alphabet)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        q = f"What is {a} + {b}? {GSM8K_SUFFIX}" if instruct else f"{a}+{b}="
        rows.append(_row("rlrig/arithmetic", q, str(a + b), split, i, q, f"#### {a + b}"))
    return rows


def gsm8k_rows(records: list[dict], split: str) -> list[dict]:
    """GSM8K's own columns (question, answer ending in `#### N`) to verl's schema."""
    out = []
    for i, r in enumerate(records):
        answer = r["answer"].split("####")[-1].strip().replace(",", "")
        out.append(
            _row("openai/gsm8k", f"{r['question']} {GSM8K_SUFFIX}", answer, split, i, r["question"], r["answer"])
        )
    return out


# verl's examples/data_preprocess/gsm8k_tool_agent_loop.py: the multi-turn GSM8K schema, with the answer-check tool
TOOL_SYSTEM = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    "You should use the `calc_gsm8k_reward` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)
TOOL_INSTRUCTION = "Let's think step by step and output the final answer after `####`."
# examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml's tool
GSM8K_TOOL = {
    "class_name": "verl.tools.gsm8k_tool.Gsm8kTool",
    "config": {"type": "native"},
    "tool_schema": {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if "
            "parsed answer is incorrect or not correctly parsed)",
            "parameters": {
                "type": "object",
                "properties": {
                    "answer": {
                        "type": "string",
                        "description": "The model's answer to the GSM8K math problem, must be a digits",
                    }
                },
                "required": ["answer"],
            },
        },
    },
}


def gsm8k_tool_rows(records: list[dict], split: str) -> list[dict]:
    """GSM8K in verl's multi-turn schema: a system prompt asking for the answer-check tool, the row running verl's
    tool agent loop (agent_name), the tool's ground truth in extra_info.tools_kwargs and an interaction's in
    extra_info.interaction_kwargs."""
    out = []
    for i, r in enumerate(records):
        solution = r["answer"].split("####")[-1].strip().replace(",", "")
        question = f"{r['question']} {TOOL_INSTRUCTION}"
        out.append(
            {
                "data_source": "openai/gsm8k",
                "agent_name": "tool_agent",
                "prompt": [{"role": "system", "content": TOOL_SYSTEM}, {"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": solution},
                "extra_info": {
                    "split": split,
                    "index": i,
                    "answer": r["answer"],
                    "question": r["question"],
                    "need_tools_kwargs": True,
                    "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": solution}}},
                    "interaction_kwargs": {"query": question, "ground_truth": solution},
                },
            }
        )
    return out


def write_parquet(rows: list[dict], path: Path) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pd.DataFrame(rows).to_parquet(tmp)
    tmp.rename(path)


def read_records(path: str) -> list[dict]:
    import pandas as pd

    p = Path(path)
    if p.suffix == ".parquet":
        return pd.read_parquet(p).to_dict("records")
    if p.suffix in (".jsonl", ".json"):
        return pd.read_json(p, lines=p.suffix == ".jsonl").to_dict("records")
    raise ConfigError(f"{path}: expected .parquet, .json or .jsonl")


def load_dataset(files: str) -> list[dict]:
    """One path or a list literal of paths, as verl accepts."""
    paths = files if isinstance(files, list) else [files]
    rows = []
    for f in paths:
        if not Path(f).is_file():
            raise ConfigError(f"data file {f} does not exist; make one with `rlrig data arithmetic --out DIR`")
        rows += read_records(f)
    if not rows:
        raise ConfigError(f"{files} holds no rows")
    return rows


def tokenize_prompts(
    rows: list[dict],
    tokenizer,
    max_len: int,
    truncation: str,
    filter_overlong: bool,
    prompt_key: str = "prompt",
    template_kwargs: dict | None = None,
    tools: list[dict] | None = None,
) -> list[dict]:
    """Adds `input_ids` (chat template applied, with the tools' schemas where there are tools) to each row; handles
    over-long prompts as verl does."""
    out = []
    for r in rows:
        if prompt_key not in r:
            raise ConfigError(
                f"data.prompt_key={prompt_key}: the data has no such column (it has {', '.join(sorted(r))})"
            )
        messages = list(r[prompt_key])
        text = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_len:
            if filter_overlong:
                continue
            if truncation == "error":
                raise ConfigError(
                    f"a prompt has {len(ids)} tokens > data.max_prompt_length={max_len}; raise it, "
                    "or set data.filter_overlong_prompts=True or data.truncation=left|right"
                )
            ids = ids[-max_len:] if truncation == "left" else ids[:max_len]
        out.append({**r, "input_ids": ids})
    if not out:
        raise ConfigError(f"every prompt is longer than data.max_prompt_length={max_len}")
    return out


def load_rows(cfg, tokenizer, tools: list[dict] | None) -> tuple[list[dict], list[dict]]:
    """The training and validation prompts, tokenized: data.train_files and data.val_files, or without them the
    offline arithmetic task. `tools`: the schemas the chat template renders into every prompt, those of
    data.tool_config_path's tools (agent.setup.tool_schemas), or None."""
    from .custom_dataset import custom_rows

    d = cfg.data
    read = (lambda files: custom_rows(d, files, tokenizer)) if d.custom_cls.path else load_dataset
    train = read(d.train_files) if d.train_files else arithmetic_rows(2048, "train", seed=d.seed)
    embedded_val = arithmetic_rows(128, "test", seed=d.seed + 1) if not d.train_files else []
    val = read(d.val_files) if d.val_files else embedded_val
    tok = lambda rows: tokenize_prompts(
        rows,
        tokenizer,
        d.max_prompt_length,
        d.truncation,
        d.filter_overlong_prompts,
        d.prompt_key,
        d.apply_chat_template_kwargs,
        tools,
    )
    return tok(train), (tok(val) if val else [])
