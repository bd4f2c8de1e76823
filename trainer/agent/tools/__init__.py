"""The tools of a tool config file (multi_turn.tool_config_path), in verl's format:

    tools:
      - class_name: rlrig.trainer.agent.tools.calculator.CalculatorTool   # any importable BaseTool subclass
        config: {type: native}                                             # handed to the tool; type is required
        tool_schema: {type: function, function: {name, description, parameters}}   # optional where the tool has one

      - class_name: verl.tools.mcp_base_tool.MCPBaseTool                   # the tools of MCP servers (tools/mcp.py)
        config: {type: mcp}
        mcp: {mcp_servers_config_path: servers.json}

verl's own tool classes are named by their verl paths in its example configs: those rlrig ports load its port.
Tools that hold servers are closed with close_tools."""

from __future__ import annotations

from ...errors import ConfigError
from ..loading import import_class, read_entries
from .base import BaseTool, ToolResponse
from .mcp import load_mcp_tools

__all__ = ["BaseTool", "ToolResponse", "close_tools", "load_tools"]

# verl's class path -> rlrig's port of it
VERL_PORTS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "rlrig.trainer.agent.tools.gsm8k.Gsm8kTool",
    "verl.tools.mcp_base_tool.MCPBaseTool": "rlrig.trainer.agent.tools.mcp.MCPBaseTool",
    "verl.tools.mcp_search_tool.MCPSearchTool": "rlrig.trainer.agent.tools.mcp_search.MCPSearchTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "rlrig.trainer.agent.tools.sandbox_fusion.SandboxFusionTool",
}


def load_tools(path: str) -> dict[str, BaseTool]:
    """The file's tools by function name; an mcp entry's servers are started here (close_tools stops them)."""
    tools: dict[str, BaseTool] = {}
    opened: dict = {}  # the MCP servers started, by their file
    try:
        for i, entry in enumerate(read_entries(path, "tools")):
            where = f"multi_turn.tool_config_path={path}: tools[{i}]"
            config = entry.get("config")
            if not isinstance(config, dict) or "type" not in config:
                raise ConfigError(f"{where}: needs config.type (native or mcp)")
            if config["type"] not in ("native", "mcp"):
                raise ConfigError(f"{where}: config.type={config['type']} is not a tool type; use native or mcp")
            cls = import_class(VERL_PORTS.get(entry.get("class_name"), entry.get("class_name")), where, BaseTool)
            if config["type"] == "mcp":
                made = load_mcp_tools(entry, cls, where, opened)
            else:
                made = [cls(config=config, tool_schema=entry.get("tool_schema"))]
            for tool in made:
                if tool.name in tools:
                    raise ConfigError(f"{where}: a second tool named {tool.name}; tool names must differ")
                tools[tool.name] = tool
    except BaseException:
        for servers in opened.values():
            servers.close()
        raise
    return tools


def close_tools(tools: dict[str, BaseTool]) -> None:
    """Stop what the tools hold outside this process (their MCP servers); safe to repeat."""
    held = {id(s): s for s in (getattr(t, "servers", None) for t in tools.values()) if s is not None}
    for servers in held.values():
        servers.close()
