"""A generative judge in a run (verl 0.9's generative reward model): reward_model.enable with a reward function of
the user's that takes `reward_router_address`. rlrig then serves reward_model.model.path with
reward_model.rollout.name's engine (reward/judge_server.py), in each training worker (colocated, asleep between
scorings on a GPU) or on the reward model's own pool (reward_model.enable_resource_pool), and calls the function
with reward_router_address (the server's host:port) and reward_model_tokenizer (the judge's tokenizer), as verl's
reward loop does. What the judge is asked and how its verdict becomes a score is the function's:
reward/judge_fn.py is rlrig's, by a template and a rule.

Metrics, from the judge's server: reward/judge/requests, failures, prompt_tokens, completion_tokens, generate_s;
from the fields the function returns: reward/judge/parse_failures (a true `judge_parse_failed`) and
reward/judge/score/mean, max, min (`judge_score`).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import urllib.request
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..rollout.engines.sglang_engine import INSTALL_HINT as SGLANG_INSTALL
from .judge_engines import ENGINES, JudgeSpec
from .vllm_scorer import INSTALL_HINT as VLLM_INSTALL
from .vllm_scorer import max_length

ROUTER = "reward_router_address"
COUNTERS = ("requests", "failures", "prompt_tokens", "completion_tokens", "generate_s")


def takes_router(fn) -> bool:
    """Whether a reward function asks for the judge's address (a `reward_router_address` parameter)."""
    return ROUTER in inspect.signature(fn).parameters


def judge_spec(rm_cfg, path: str, device: str) -> JudgeSpec:
    """The judge's engine settings from reward_model.rollout.* and its model's position limit."""
    from dataclasses import asdict

    from transformers import AutoConfig

    trust = rm_cfg.model.trust_remote_code
    conf = AutoConfig.from_pretrained(path, **({"trust_remote_code": True} if trust else {}))
    limit = getattr(conf, "max_position_embeddings", None)
    return JudgeSpec(path, device, asdict(rm_cfg.rollout), max_length(rm_cfg.rollout, limit), trust)


def check_judge(cfg) -> None:
    """Before any worker starts: the judge has a model, an engine rlrig serves judges with, one device each."""
    rm = cfg.reward_model
    r = rm.rollout
    if not rm.model.path:
        raise ConfigError(
            "reward_model.enable=True with a reward function that takes reward_router_address serves a generative "
            "judge: set reward_model.model.path (verl 0.9: reward.reward_model.model_path) to the judge's model"
        )
    if r.name not in ENGINES:
        raise ConfigError(
            f"reward_model.rollout.name={r.name}: a generative judge is served by one of {', '.join(ENGINES)}"
        )
    package = {"vllm": ("vllm", VLLM_INSTALL), "sglang": ("sglang", SGLANG_INSTALL)}.get(r.name)
    if package is not None and importlib.util.find_spec(package[0]) is None:
        raise ConfigError(
            f"reward_model.rollout.name={r.name}: the judge's engine is not installed here: {package[1]}, or serve "
            "the judge with reward_model.rollout.name=hf (transformers)"
        )
    if r.tensor_model_parallel_size != 1:
        raise ConfigError(
            f"reward_model.rollout.tensor_model_parallel_size={r.tensor_model_parallel_size}: rlrig serves a "
            "generative judge on one device per server; set it to 1 (a pool of its own gives one server per GPU)"
        )
    unknown = set(r.engine_kwargs) - {"vllm", "sglang"}
    if unknown:
        raise ConfigError(
            f"reward_model.rollout.engine_kwargs.{sorted(unknown)[0]}: put the judge engine's arguments under "
            "reward_model.rollout.engine_kwargs.vllm or .sglang"
        )


class NoJudge:
    """A run without a generative judge: JudgeLink's interface, doing nothing."""

    concurrent = False  # the reward function's calls need not meet anywhere

    def kwargs(self) -> dict:
        return {}

    def awake(self):
        return nullcontext()

    def metrics(self, fields: list[dict]) -> dict:
        return {}


NO_JUDGE = NoJudge()


def _post(address: str, path: str) -> dict:
    req = urllib.request.Request(f"http://{address}{path}", data=b"{}" if path != "/rlrig/stats" else None)
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


@dataclass
class JudgeLink:
    """A training worker's way to its judge: the address and tokenizer its reward function gets, waking the judge
    around a scoring where it sleeps between them, and the server's counters over the last scoring where this
    worker reports them (the first of the workers that share a server, so that summed over workers each request
    counts once; on a shared pool server the other workers' requests of the same moment count too)."""

    concurrent = True  # the reward function's calls run together, so that the judge answers them in batches
    address: str
    tokenizer: object  # the judge's: verl's reward_model_tokenizer
    sleeps: bool  # colocated: woken for each scoring
    reports: bool
    last: dict = field(default_factory=dict)

    @classmethod
    def of(cls, address: str, path: str, trust_remote_code: bool, sleeps: bool, reports: bool) -> JudgeLink:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, **({"trust_remote_code": True} if trust_remote_code else {}))
        link = cls(address, tok, sleeps, reports)
        link.last = _post(address, "/rlrig/stats")
        return link

    def kwargs(self) -> dict:
        return {ROUTER: self.address, "reward_model_tokenizer": self.tokenizer}

    @contextmanager
    def awake(self):
        """Around one scoring: the judge woken where it sleeps, and its counters read at the start, so that
        metrics() counts this scoring's requests only (a validation's are not a step's)."""
        if self.reports:
            self.last = _post(self.address, "/rlrig/stats")
        if self.sleeps:
            _post(self.address, "/rlrig/wake")
        try:
            yield
        finally:
            if self.sleeps:
                _post(self.address, "/rlrig/sleep")

    def metrics(self, fields: list[dict]) -> dict:
        """The judge's metrics for one scoring (see the module's docstring)."""
        out = {}
        if self.reports:
            now = _post(self.address, "/rlrig/stats")
            out = {f"reward/judge/{k}": now[k] - self.last.get(k, 0) for k in COUNTERS}
            self.last = now
        out["reward/judge/parse_failures"] = sum(bool(f.get("judge_parse_failed")) for f in fields)
        scores = [float(f["judge_score"]) for f in fields if f.get("judge_score") is not None]
        if scores:
            out.update(
                {
                    "reward/judge/score/mean": sum(scores) / len(scores),
                    "reward/judge/score/max": max(scores),
                    "reward/judge/score/min": min(scores),
                }
            )
        return out
