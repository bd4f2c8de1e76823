"""The tools of a tool config file (multi_turn.tool_config_path), in verl's format:

    tools:
      - class_name: rlrig.trainer.agent.tools.calculator.CalculatorTool   # any importable BaseTool subclass
        config: {type: native}                                             # handed to the tool; type is required
        tool_schema: {type: function, function: {name, description, parameters}}   # optional where the tool has one

verl's own tool classes are named by their verl paths in its example configs: those rlrig ports load its port."""

from __future__ import annotations

from ...errors import ConfigError
from ..loading import import_class, read_entries
from .base import BaseTool, ToolResponse

__all__ = ["BaseTool", "ToolResponse", "load_tools"]

# verl's class path -> rlrig's port of it
VERL_PORTS = {"verl.tools.gsm8k_tool.Gsm8kTool": "rlrig.trainer.agent.tools.gsm8k.Gsm8kTool"}


def load_tools(path: str) -> dict[str, BaseTool]:
    """The file's tools by function name."""
    tools: dict[str, BaseTool] = {}
    for i, entry in enumerate(read_entries(path, "tools")):
        where = f"multi_turn.tool_config_path={path}: tools[{i}]"
        config = entry.get("config")
        if not isinstance(config, dict) or "type" not in config:
            raise ConfigError(f"{where}: needs config.type (native)")
        if config["type"] == "mcp":
            raise ConfigError(f"{where}: MCP tools are not in rlrig; write the tool as a native BaseTool subclass")
        if config["type"] != "native":
            raise ConfigError(f"{where}: config.type={config['type']} is not a tool type; use native")
        cls = import_class(VERL_PORTS.get(entry.get("class_name"), entry.get("class_name")), where, BaseTool)
        tool = cls(config=config, tool_schema=entry.get("tool_schema"))
        if tool.name in tools:
            raise ConfigError(f"{where}: a second tool named {tool.name}; tool names must differ")
        tools[tool.name] = tool
    return tools
