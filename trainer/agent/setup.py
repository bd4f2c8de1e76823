"""The agent loop's start-up checks on the driver, before any worker is placed: the tool and interaction configs load,
every row names a loop rlrig has (and, with interactions, one of them), and what runs is said where verl's keys
could mislead."""

from __future__ import annotations

from ..errors import ConfigError
from . import own_loops
from .interactions import load_interactions
from .loop import SINGLE_TURN, TOOL_AGENT
from .tool_parser import PARSERS
from .tools import close_tools, load_tools

AGENT_LOOPS = (SINGLE_TURN, TOOL_AGENT)


def agent_of(row: dict, default: str) -> str:
    return row.get("agent_name") or default


def tool_schemas(path: str | None) -> list[dict] | None:
    """The tools' schemas as the chat template renders them into every prompt (data.tool_config_path), or None."""
    if not path:
        return None
    tools = load_tools(path)
    close_tools(tools)
    return [t.tool_schema for t in tools.values()]


def check(cfg, rows: list[dict]) -> str | None:
    """A ConfigError for the first problem; else a line to tell the user, or None."""
    r = cfg.actor_rollout_ref.rollout
    mt, default = r.multi_turn, r.agent.default_agent_loop
    names = {agent_of(row, default) for row in rows}
    own_loops.check(cfg, names)
    if TOOL_AGENT in names and mt.format not in PARSERS:
        raise ConfigError(
            f"actor_rollout_ref.rollout.multi_turn.format={mt.format}: rlrig's tool-call parsers are "
            f"{', '.join(PARSERS)} (verl's are hermes and gpt-oss)"
        )
    if mt.tool_config_path:
        close_tools(load_tools(mt.tool_config_path))
    if mt.interaction_config_path:
        interactions = load_interactions(mt.interaction_config_path)
        for row in rows:
            if agent_of(row, default) != TOOL_AGENT:
                continue
            name = ((row.get("extra_info") or {}).get("interaction_kwargs") or {}).get("name")
            if name not in interactions:
                raise ConfigError(
                    f"multi_turn.interaction_config_path={mt.interaction_config_path} and a row's "
                    f"extra_info.interaction_kwargs.name={name}: name one of {sorted(interactions)} in every row"
                )
    if mt.enable and TOOL_AGENT not in names:
        return (
            f"actor_rollout_ref.rollout.multi_turn.enable=True: as in verl, a row's agent_name (else "
            f"rollout.agent.default_agent_loop={default}) picks its loop, and no row runs {TOOL_AGENT}: every rollout "
            f"is single-turn{' with the tools in its prompt' if mt.tool_config_path else ''}; set "
            f"actor_rollout_ref.rollout.agent.default_agent_loop={TOOL_AGENT} for tool calls"
        )
    return None
