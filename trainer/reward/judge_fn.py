"""rlrig's reward function for a generative judge (reward/judge.py): the judge is asked by a template or a
function of yours, and its reply becomes a score by a rule or a function of yours. Name it as a verl custom reward
function, with its settings as verl's custom_reward_function.reward_kwargs:

    reward_model.enable=True reward_model.model.path=JUDGE reward_model.rollout.name=vllm
    custom_reward_function.path=pkg://rlrig.trainer.reward.judge_fn custom_reward_function.name=compute_score
    +custom_reward_function.reward_kwargs.template='...{question}...{response}...'

reward_kwargs (all optional):
- template: the judge's user message, a str.format string over the row's extra_info fields (verl's data rows
  carry `question`) and {response}, {ground_truth}, {data_source}. Default: DEFAULT_TEMPLATE.
- system: a system message before it.
- prompt_fn: "FILE.py:NAME" or "pkg://MODULE:NAME", a function (data_source, solution_str, ground_truth,
  extra_info) -> the judge's messages, in place of template and system.
- verdict: a regular expression; the score is its first group (else its whole match) in the reply, as a number.
  Default: the last number in the reply.
- parse_fn: "FILE.py:NAME" or "pkg://MODULE:NAME", a function (reply) -> the score, or None where the reply
  holds none, in place of verdict.
- scale: [low, high]: the verdict mapped linearly onto 0..1 (a 1-10 judge's 10 is 1.0). Default: as it is.
- unparsed_score: the score where the reply holds no verdict (counted in reward/judge/parse_failures). Default 0.
- rule_weight: w: the rule-based reward of the row's data_source (the default reward function) added, times w:
  a judge beside rule rewards. Default 0 (the judge alone).
- max_tokens (default 64), temperature (default 0: the judge's most likely reply), top_p, seed: the request's.

The result is verl's dict: score, judge_score (the judge's part, before rule_weight), judge_parse_failed, and
rule_score (the rule-based reward, watched in validation) where the data_source has one.
"""

from __future__ import annotations

import functools
import re

import aiohttp

DEFAULT_TEMPLATE = (
    "You are given a problem and a proposed solution.\n\nProblem:\n{question}\n\nSolution:\n{response}\n\n"
    "Please evaluate how well the solution addresses the problem. Give a score from 1 to 10, where 1 means the "
    "solution is incorrect and 10 means it is fully correct.\n\nOnly output the score as a single number."
)
LAST_NUMBER = r"(-?\d+(?:\.\d+)?)(?!.*\d)"


@functools.cache
def _function(spec: str):
    from ..data.extern import load_object

    path, _, name = spec.rpartition(":")
    return load_object(path, name, "custom_reward_function.reward_kwargs")


def messages(data_source, solution_str, ground_truth, extra_info, kw: dict) -> list[dict]:
    """What the judge is asked (see the module's docstring)."""
    if kw.get("prompt_fn"):
        return _function(kw["prompt_fn"])(data_source, solution_str, ground_truth, extra_info)
    fields = {**(extra_info or {}), "response": solution_str, "ground_truth": ground_truth, "data_source": data_source}
    try:
        user = kw.get("template", DEFAULT_TEMPLATE).format(**fields)
    except KeyError as e:
        raise ValueError(
            f"custom_reward_function.reward_kwargs.template names {e}, which the row's extra_info does not have "
            f"(it has {', '.join(sorted(extra_info or {})) or 'none'}; and response, ground_truth, data_source)"
        ) from None
    system = [{"role": "system", "content": kw["system"]}] if kw.get("system") else []
    return system + [{"role": "user", "content": user}]


def verdict(reply: str, kw: dict) -> float | None:
    """The reply's score by the rule or function (see the module's docstring), scaled; None where it holds none."""
    if kw.get("parse_fn"):
        v = _function(kw["parse_fn"])(reply)
    else:
        m = re.search(kw.get("verdict", LAST_NUMBER), reply, re.DOTALL)
        v = (m.group(1) if m.groups() else m.group(0)) if m else None
    try:
        v = None if v is None else float(v)
    except ValueError:
        v = None
    if v is None or "scale" not in kw:
        return v
    low, high = kw["scale"]
    return (v - low) / (high - low)


async def ask(address: str, body: dict) -> str:
    """The judge's reply to one chat request; an HTTP error raises with the server's message."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as s:
        async with s.post(f"http://{address}/v1/chat/completions", json=body) as resp:
            out = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"the judge answered HTTP {resp.status}: {(out.get('error') or {}).get('message')}")
    return out["choices"][0]["message"]["content"] or ""


async def compute_score(
    data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None, **kw
) -> dict:
    """verl's custom reward function for a generative judge (see the module's docstring); reward_model_tokenizer,
    which verl passes too, is not needed: the judge's server renders the messages in the judge's template."""
    kw.pop("reward_model_tokenizer", None)
    body = {
        "messages": messages(data_source, solution_str, ground_truth, extra_info, kw),
        "max_tokens": kw.get("max_tokens", 64),
        "temperature": kw.get("temperature", 0.0),
    }
    body.update({k: kw[k] for k in ("top_p", "seed") if k in kw})
    judged = verdict(await ask(reward_router_address, body), kw)
    part = float(kw.get("unparsed_score", 0.0)) if judged is None else judged
    out = {"judge_score": part, "judge_parse_failed": judged is None}
    rule = rule_score(data_source, solution_str, ground_truth, extra_info)
    if rule is not None:
        out["rule_score"] = rule
    if kw.get("rule_weight"):
        if rule is None:
            raise ValueError(
                f"custom_reward_function.reward_kwargs.rule_weight: data_source {data_source!r} has no rule-based "
                "reward in rlrig; drop rule_weight or score that source with a function of your own"
            )
        part += float(kw["rule_weight"]) * rule
    return {"score": part, **out}


def rule_score(data_source, solution_str, ground_truth, extra_info) -> float | None:
    """The rule-based reward of the row's data_source (the default reward function), None where it has none."""
    from .rules import RULE_SOURCES, default_compute_score

    if data_source not in RULE_SOURCES:
        return None
    rule = default_compute_score(data_source, solution_str, ground_truth, extra_info)
    return float(rule["score"] if isinstance(rule, dict) else rule)
