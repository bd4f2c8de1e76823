"""Agent loops of your own (verl's AgentLoopBase subclasses) run over rlrig's batched engines.

Which loop a row runs is verl's choice: its agent_name, else rollout.agent.default_agent_loop, looked up among the
entries of rollout.agent.agent_loop_config_path (a YAML list of `name` + `_target_`, further keys passed to the
constructor, as hydra.utils.instantiate does in verl) and the names registered with @register (rlrig's
agent/verl_api.py, or verl's own where verl is importable). single_turn_agent and tool_agent stay rlrig's own unless
the config file names them.

Each sample is its own loop object and coroutine, as in verl. Their server_manager.generate calls are gathered:
once every loop still running waits on one, they all go to the engine together (one call per sampling), so a batch
of loops costs about one engine call per turn, as rlrig's own tool loop does. A loop that raises fails the step
with a line naming it, as an exception in a verl loop fails verl's generate_sequences.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import os
import sys
from dataclasses import dataclass, field

from ..errors import ConfigError, first_line, raised_where
from ..reward.scoring import LOOP_SCORE
from ..rollout.engines.base import Sampling
from . import verl_api
from .loop import SINGLE_TURN, TOOL_AGENT, Trajectory
from .server_manager import ServerManager


class OwnLoopError(ConfigError):
    """A loop of your own raised, or returned what rlrig cannot train on: one line naming the loop (the run stops
    before the step's update, as verl's generate_sequences fails with its loop's exception)."""


class ConfigView(dict):
    """The run's config as a loop reads it in verl (a DictConfig): attribute or key access, .get; the rollout section
    with verl's prompt_length and response_length (data.max_prompt_length, data.max_response_length)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:  # as OmegaConf's: a missing key raises, so getattr(cfg, key, default) works
            raise AttributeError(f"the config has no key {name!r}") from None

    @classmethod
    def of(cls, cfg) -> ConfigView:
        view = cls.wrap(dataclasses.asdict(cfg))
        view.actor_rollout_ref.rollout.update(
            prompt_length=cfg.data.max_prompt_length, response_length=cfg.data.max_response_length
        )
        return view

    @classmethod
    def wrap(cls, value):
        if isinstance(value, dict):
            return cls({k: cls.wrap(v) for k, v in value.items()})
        if isinstance(value, list):
            return [cls.wrap(v) for v in value]
        return value


def _verl_registry() -> dict:
    """The loops registered with verl's own @register, where a loop's module imported verl's agent loop, less verl's
    built-ins (rlrig runs those itself). verl is never imported for this: a loop that registers there imports it."""
    module = sys.modules.get("verl.experimental.agent_loop.agent_loop")
    registry = getattr(module, "_agent_loop_registry", None) or {}
    builtin = "verl.experimental.agent_loop."
    return {k: dict(v) for k, v in registry.items() if not str(v.get("_target_", "")).startswith(builtin)}


def config_entries(path: str | None) -> dict[str, dict]:
    """agent_loop_config_path's entries by name (verl's file: a list of {name, _target_, constructor keys})."""
    if not path:
        return {}
    import yaml

    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError:
        raise ConfigError(f"rollout.agent.agent_loop_config_path={path}: no such file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"rollout.agent.agent_loop_config_path={path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, list) or not all(isinstance(e, dict) and e.get("name") and e.get("_target_") for e in doc):
        raise ConfigError(
            f"rollout.agent.agent_loop_config_path={path}: expected a YAML list of entries with `name` and "
            "`_target_` (pkg.module.Class), as verl reads it"
        )
    return {str(e["name"]): dict(e) for e in doc}


def import_target(name: str, target) -> type:
    """The class an entry's _target_ names, checked to be an agent loop."""
    if not isinstance(target, str) or "." not in target:
        raise ConfigError(f"agent loop {name}: _target_ must be a module path such as pkg.module.Class, not {target!r}")
    module, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except AttributeError:
        raise ConfigError(f"agent loop {name}: module {module} has no class {attr} (its _target_={target})") from None
    except Exception as e:
        raise ConfigError(
            f"agent loop {name}: its _target_={target} cannot be imported ({type(e).__name__}: {first_line(e)})"
        ) from None
    if not isinstance(cls, type) or not asyncio.iscoroutinefunction(getattr(cls, "run", None)):
        raise ConfigError(f"agent loop {name}: {target} is not an agent loop (an AgentLoopBase with `async def run`)")
    return cls


def loop_table(path: str | None) -> dict[str, tuple[type, dict]]:
    """Every loop of your own by name: (its class, the constructor keys of its entry). The config file's entries
    win over registered names, as verl lets them."""
    config = config_entries(path)
    # the file's classes first: importing them runs the @register of their modules
    classes = {name: import_target(name, e["_target_"]) for name, e in config.items()}
    entries = {**verl_api._agent_loop_registry, **_verl_registry(), **config}
    return {name: (classes.get(name) or import_target(name, e["_target_"]), e) for name, e in entries.items()}


def known_names(table: dict) -> list[str]:
    return sorted({SINGLE_TURN, TOOL_AGENT, *table})


def check(cfg, names: set[str]) -> None:
    """The start-up check: the loops load, every loop the rows name (agent_name, else default_agent_loop) is one,
    and a loop of your own runs where rlrig can run it."""
    from ..config.overrides import FULLY_ASYNC

    agent = cfg.actor_rollout_ref.rollout.agent
    table = loop_table(agent.agent_loop_config_path)
    unknown = sorted(str(n) for n in names if n not in known_names(table))
    if unknown:
        where = (
            f"rollout.agent.default_agent_loop={unknown[0]}"
            if unknown[0] == agent.default_agent_loop
            else f"agent_name={unknown[0]} in the data"
        )
        raise ConfigError(
            f"{where}: no agent loop of that name (the loops are {', '.join(known_names(table))}); name it with its "
            "class in rollout.agent.agent_loop_config_path (a YAML list of `name` + `_target_`) or pick one of them"
        )
    used = sorted(n for n in names if n in table)
    for name in used:  # a loop class may check its entry's own keys at start-up (OpenAIAgentLoop does)
        cls, entry = table[name]
        if hasattr(cls, "check_entry"):
            cls.check_entry(name, entry)
    if used and cfg.trainer.async_mode == FULLY_ASYNC and cfg.async_training.partial_rollout:
        partial_refusal(cfg, used[0], sorted(n for n in names if n not in table))


def partial_refusal(cfg, loop: str, others: list[str]) -> None:
    """Loops of your own across weight syncs stay on the worker that started them (agent/own_partial.py): an engine
    of one worker, and no rows of rlrig's loops beside them (those move between engines)."""
    tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    why = (
        f"with actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: a loop of your own halted by a weight sync "
        "goes on on the worker that started it, and an engine over several workers is not built for that; set it to "
        "1 or async_training.partial_rollout=False"
        if tp > 1
        else f"beside rows of rlrig's {others[0]}: with async_training.partial_rollout=True a run's rows use loops of "
        "your own or rlrig's, not both; name one loop for all of them, or set async_training.partial_rollout=False"
        if others
        else None
    )
    if why:
        raise ConfigError(f"agent loop {loop} {why}")


@dataclass
class OwnTrajectory(Trajectory):
    """A sample a loop of your own made: its AgentLoopOutput as rlrig's trajectory."""

    loop_name: str = ""
    reported_turns: int = 0
    extra_fields: dict = field(default_factory=dict)
    reward_score: float | None = None
    counters: dict = field(default_factory=dict)  # the loop's metrics.counters(): summed over the batch

    @property
    def num_turns(self) -> int:
        return self.reported_turns

    def info(self) -> dict:
        out = {**self.extra_fields, "num_turns": self.reported_turns}
        if self.reward_score is not None:
            out[LOOP_SCORE] = float(self.reward_score)
        return out


def trajectory(name: str, out, prompt_limit: int, response_limit: int) -> tuple[OwnTrajectory, bool]:
    """A loop's AgentLoopOutput (rlrig's or verl's) checked and cut as verl cuts it (the prompt's start to
    prompt_length, the response's end to response_length), and whether it came with log-probs."""
    if not all(hasattr(out, k) for k in ("prompt_ids", "response_ids", "response_mask")):
        raise OwnLoopError(f"agent loop {name} returned {type(out).__name__}, not an AgentLoopOutput")
    ids, mask, logps = list(out.response_ids), list(out.response_mask), out.response_logprobs
    if len(mask) != len(ids) or (logps is not None and len(logps) != len(ids)):
        lp = "" if logps is None else f", response_logprobs {len(logps)}"
        raise OwnLoopError(
            f"agent loop {name} returned response_ids of {len(ids)} tokens and response_mask {len(mask)}{lp}: "
            "they must be as long"
        )
    if getattr(out, "multi_modal_data", None):
        raise OwnLoopError(f"agent loop {name} returned multi_modal_data: rlrig's rollouts are text only")
    metrics = out.metrics if isinstance(out.metrics, dict) else out.metrics.model_dump()
    t = OwnTrajectory(
        prompt=list(out.prompt_ids)[-prompt_limit:],
        messages=[],
        tools_kwargs={},
        multi_turn=False,
        loop_name=name,
        reported_turns=int(out.num_turns),
        extra_fields=dict(out.extra_fields or {}),
        reward_score=out.reward_score,
        counters=dict(out.metrics.counters()) if hasattr(out.metrics, "counters") else {},
        done=True,
    )
    R = response_limit
    t.ids, t.mask = ids[:R], [int(m) for m in mask[:R]]
    t.logps = [float(x) for x in logps[:R]] if logps is not None else [0.0] * len(t.ids)
    t.gen_s, t.tool_s = float(metrics.get("generate_sequences", 0.0)), float(metrics.get("tool_calls", 0.0))
    return t, logps is not None


def sampling_params(s: Sampling, logprobs: bool) -> dict:
    """verl's sampling_params for a loop's generate calls (temperature 0: greedy)."""
    return {
        "temperature": 0.0 if s.greedy else s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "repetition_penalty": 1.0,
        "logprobs": logprobs,
    }


def sampling_of(params: dict, base: Sampling) -> Sampling:
    t = float(params.get("temperature", base.temperature))
    return Sampling(t, float(params.get("top_p", base.top_p)), int(params.get("top_k", base.top_k)), t > 0)


def row_kwargs(row: dict, prompt_key: str) -> dict:
    """What verl's dataset gives a loop's run for a row: its columns, its messages as raw_prompt, and index,
    tools_kwargs and interaction_kwargs from its extra_info (agent_name is the loop's choice, not passed)."""
    extra = dict(row.get("extra_info") or {})
    kwargs = {k: v for k, v in row.items() if k not in ("input_ids", prompt_key, "agent_name")}
    kwargs.update(
        raw_prompt=list(row[prompt_key]),
        extra_info=extra,
        index=extra.get("index", 0),
        tools_kwargs=extra.get("tools_kwargs") or {},
        interaction_kwargs=extra.get("interaction_kwargs") or {},
    )
    return kwargs


def model_type(path: str) -> str | None:
    """The model's config's model_type, which verl's token builder is chosen by; None where it cannot be read."""
    if not os.path.isdir(path):  # a hub name is not fetched for this
        return None
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path).model_type
    except Exception:  # a GGUF or preset model without a config: verl's default builder, as for an unknown type
        return None


class OwnLoops:
    """The loops of your own for one worker's engine: their table loaded once (agent_loop_config_path and the
    registered names), every batch of their rows run through it."""

    def __init__(self, table: dict, cfg, tokenizer, tools: dict):
        self.table, self.cfg = table, cfg
        self.tok, self.tools = tokenizer, list(tools.values())
        self._made = None  # what the loops' constructors get, made on first use: (config view, model type)

    def made(self) -> tuple[ConfigView, str | None]:
        if self._made is None:
            # the embedded model's run names no path: its tokenizer knows where it was loaded from
            path = self.cfg.actor_rollout_ref.model.path or getattr(self.tok, "name_or_path", "")
            self._made = ConfigView.of(self.cfg), model_type(path)
        return self._made

    @classmethod
    def of(cls, cfg, tokenizer, tools: dict) -> OwnLoops | None:
        """The worker's loops of your own; None where there are none."""
        table = loop_table(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
        return cls(table, cfg, tokenizer, tools) if table else None

    def runs(self, name: str) -> bool:
        return name in self.table

    def generate(self, engine, rows: list[dict], names: list[str], n: int, sampling: Sampling | None):
        """n samples of each row (row i's at i*n .. i*n+n-1), each by its own loop object: their trajectories, and
        whether every loop returned log-probs."""
        base = sampling or Sampling.of(self.cfg.actor_rollout_ref.rollout)
        params = sampling_params(base, False)
        R = self.cfg.data.max_response_length
        jobs = [(name, row) for row, name in zip(rows, names) for _ in range(n)]

        async def run_all():
            manager = ServerManager(engine, base, R, sampling_of)
            return await manager.drive([self.run_one(manager, name, row, params) for name, row in jobs])

        outs = asyncio.run(run_all()) if jobs else []
        made = [trajectory(name, out, self.cfg.data.max_prompt_length, R) for (name, _), out in zip(jobs, outs)]
        return [t for t, _ in made], all(with_logps for _, with_logps in made)

    async def run_one(self, manager: ServerManager, name: str, row: dict, params: dict):
        """One sample of `row` by a new object of loop `name`, its generate calls through `manager`: its
        AgentLoopOutput. A loop that raises is an OwnLoopError naming it."""
        cls, entry = self.table[name]
        view, hf_model_type = self.made()
        try:
            loop = cls(
                **{k: v for k, v in entry.items() if k != "_target_"},
                trainer_config=verl_api.DictConfigWrap(view),
                server_manager=manager,
                tokenizer=self.tok,
                processor=None,
                hf_model_type=hf_model_type,
                dataset_cls=None,
                data_config=verl_api.DictConfigWrap(view.data),
                tools=verl_api.ToolListWrap(self.tools),
            )
            return await loop.run(dict(params), **row_kwargs(row, self.cfg.data.prompt_key))
        except OwnLoopError:
            raise
        except Exception as e:
            raise OwnLoopError(
                f"agent loop {name} ({entry['_target_']}) raised {type(e).__name__}: {first_line(e)}{raised_where(e)}"
            ) from e
