"""Rule-based rewards chosen by data_source, user functions loaded by verl's module paths (a file, or pkg:// an
installed module), and which of them (or the reward model) a run scores with."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from functools import partial

from ..data.extern import load_object
from ..errors import ConfigError
from .managers import is_own
from .sandbox_fusion import CODE_SOURCES, SandboxClient, compute_score

RULE_SOURCES = ("openai/gsm8k", "rlrig/arithmetic", "rlrig/calculator")

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def extract_solution(text: str, method: str = "strict") -> str | None:
    """verl's GSM8K extraction: last 300 characters, last `#### N` (strict) or last number (flexible)."""
    text = text[-300:]
    if method == "strict":
        found = STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = [x for x in FLEXIBLE.findall(text) if x not in ("", ".")]
    return found[-1] if found else None


def gsm8k_score(
    solution: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """verl's GSM8K reward: `score` when the extracted answer equals the ground truth, `format_score` when an answer
    is there but wrong, 0 when none is."""
    answer = extract_solution(solution, method)
    if answer is None:
        return 0.0
    return score if answer == str(ground_truth) else format_score


def default_compute_score(
    data_source: str, solution: str, ground_truth, extra_info=None, sandbox: SandboxClient | None = None
) -> float:
    """The rule-based reward of RULE_SOURCES' rows (the GSM8K check, strict); with a sandbox, the code reward of
    CODE_SOURCES' rows (ground_truth: their test cases), as verl's default_compute_score; a ValueError for another
    source."""
    if data_source in RULE_SOURCES:
        return gsm8k_score(solution, ground_truth)
    if data_source in CODE_SOURCES and sandbox is not None:
        return compute_score(sandbox, solution, ground_truth, continuous=True)
    raise ValueError(f"no rule-based reward for data_source {data_source!r}; set custom_reward_function.path and .name")


def sandbox_refusal(sf) -> str | None:
    """reward_model.sandbox_fusion checked: url an http(s) /run_code URL or `local`, limits positive."""
    if sf.url is not None and sf.url != "local" and not sf.url.startswith(("http://", "https://")):
        return (
            f"reward_model.sandbox_fusion.url={sf.url!r} is not a URL; give a SandboxFusion endpoint "
            "(http://host:port/run_code) or local to start rlrig sandbox beside the run"
        )
    for key in ("max_concurrent", "memory_limit_mb"):
        if getattr(sf, key) is not None and getattr(sf, key) < 1:
            return f"reward_model.sandbox_fusion.{key}={getattr(sf, key)} must be at least 1 (null: verl's default)"
    return None


def with_kwargs(fn: Callable, extra: dict) -> Callable:
    """`fn` called with `extra` merged over the keywords of each call, as verl's get_custom_reward_fn applies
    custom_reward_function.reward_kwargs; its signature stays fn's (inspect follows __wrapped__)."""
    if not extra:
        return fn
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def call_async(*args, **kwargs):
            return await fn(*args, **{**kwargs, **extra})

        return call_async

    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **{**kwargs, **extra})

    return call


def load_reward_fn(path: str | None, name: str, sandbox_fusion=None, reward_kwargs: dict | None = None) -> Callable:
    """As verl's get_custom_reward_fn: `path` a .py file (file:// or bare) or pkg://module, `name` the function,
    called with reward_kwargs. Without one, the default, which with sandbox_fusion.url set scores code rows in that
    sandbox (verl's load_reward_manager: the sandbox is for the default function only)."""
    if path:
        return with_kwargs(load_object(path, name, "custom_reward_function.path/name"), dict(reward_kwargs or {}))
    if sandbox_fusion is not None and sandbox_fusion.url:
        client = SandboxClient.of(
            sandbox_fusion.url, sandbox_fusion.max_concurrent or 64, sandbox_fusion.memory_limit_mb or 1024
        )
        return partial(default_compute_score, sandbox=client)
    return default_compute_score


def check_sources(sources: set[str], custom_path: str | None, sandbox_url: str | None = None) -> None:
    """Before any worker starts: every data_source has a rule-based reward (code rows: a sandbox to run them), or
    a custom function is set."""
    unknown = sorted(sources - set(RULE_SOURCES) - (set(CODE_SOURCES) if sandbox_url else set()))
    if unknown and not custom_path:
        code = [s for s in unknown if s in CODE_SOURCES]
        hint = (
            f"; data_source {', '.join(map(repr, code))} is scored by running its code: set "
            "reward_model.sandbox_fusion.url (a SandboxFusion /run_code URL, or local to start rlrig sandbox)"
            if code
            else ""
        )
        raise ConfigError(
            f"no rule-based reward for data_source {', '.join(map(repr, unknown))} (rlrig has "
            f"{', '.join(RULE_SOURCES)}); set custom_reward_function.path and .name{hint}"
        )


def takes_rm_score(fn: Callable) -> bool:
    """Whether a reward function accepts the reward model's score (an `rm_score` parameter, or **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    return any(p.name == "rm_score" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def reward_fn(cfg) -> Callable | None:
    """The function that scores a run's samples: the rule-based default or the custom function; None where the
    reward model's score alone is the reward (verl: a reward model and no custom function)."""
    rf = cfg.custom_reward_function
    if cfg.reward_model.enable and not rf.path:
        return None
    return load_reward_fn(rf.path, rf.name, cfg.reward_model.sandbox_fusion, rf.reward_kwargs)


def serves_judge(cfg) -> bool:
    """Whether the reward model is a generative judge served for the reward code to call (reward/judge.py), as
    verl's reward loop hands its reward-model servers' address to a reward manager of your own, or to a reward
    function that takes reward_router_address."""
    from .judge import takes_router

    if not cfg.reward_model.enable:
        return False
    if is_own(cfg.reward_model):
        return True
    fn = reward_fn(cfg)
    return fn is not None and takes_router(fn)


def check_reward_setup(cfg, sources: set[str]) -> None:
    """Before any worker starts: the reward function loads, every data_source has a rule, and a custom function
    used beside the reward model takes its score."""
    why = sandbox_refusal(cfg.reward_model.sandbox_fusion)
    if why:
        raise ConfigError(why)
    rf, fn = cfg.custom_reward_function, reward_fn(cfg)  # a bad path or name stops here
    if serves_judge(cfg):
        from .judge import check_judge

        check_judge(cfg)
    if is_own(cfg.reward_model):
        from .own_managers import resolve

        resolve(cfg)  # a class that loads and is one; which data sources it scores is its own affair
        return
    if not cfg.reward_model.enable:
        check_sources(sources, rf.path, cfg.reward_model.sandbox_fusion.url)
    elif fn is not None and not takes_rm_score(fn) and not serves_judge(cfg):
        raise ConfigError(
            f"custom_reward_function {rf.name} in {rf.path} is used with reward_model.enable=True: rlrig calls it "
            "with the model's score as the keyword rm_score, or, for a generative judge, with the judge's address "
            "as reward_router_address (verl 0.9's); add one of those parameters"
        )
