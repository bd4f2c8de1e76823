"""A tool as verl defines one (verl/tools/base_tool.py): made from its entry in the tool config, described to the
model by an OpenAI function schema, and used through an instance per call: create, execute, release. A tool of your
own subclasses BaseTool and is named by its module path in the tool config."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError


@dataclass
class ToolResponse:
    """What a call returns to the model. Only text reaches a text model: image and video are refused."""

    text: str | None = None
    image: list | None = None
    video: list | None = None


# verl's pydantic schema keeps these fields and drops any others (e.g. a property's `items`): the model's prompt holds
# the schema as verl renders it
_PROPERTY_FIELDS = ("type", "description", "enum")


def function_schema(schema: Any, where: str) -> dict:
    """A tool's OpenAI function schema checked and reduced to verl's fields (what the chat template renders)."""
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"), dict):
        raise ConfigError(
            f"{where}: tool_schema must be {{type: function, function: {{name, description, parameters}}}}"
        )
    fn = schema["function"]
    for key in ("name", "description"):
        if not isinstance(fn.get(key), str) or (key == "name" and not fn[key]):
            raise ConfigError(f"{where}: tool_schema.function.{key} must be a string")
    params = fn.get("parameters", {"type": "object", "properties": {}, "required": []})
    if not isinstance(params, dict) or not {"type", "properties", "required"} <= set(params):
        raise ConfigError(f"{where}: tool_schema.function.parameters needs type, properties and required")
    props = {}
    for name, prop in dict(params["properties"]).items():
        if not isinstance(prop, dict) or not isinstance(prop.get("type"), str):
            raise ConfigError(f"{where}: tool_schema.function.parameters.properties.{name} needs a type")
        props[name] = {k: prop[k] for k in _PROPERTY_FIELDS if prop.get(k) is not None}
    out = {"name": fn["name"], "description": fn["description"]}
    out["parameters"] = {"type": params["type"], "properties": props, "required": list(params["required"])}
    if "strict" in fn:  # verl leaves out what the config did not set
        out["strict"] = bool(fn["strict"])
    return {"type": "function", "function": out}


class BaseTool:
    """verl's tool interface. A subclass is named by its module path in the tool config and built once per worker
    with its entry's config and tool_schema (else get_openai_tool_schema's); the schema's function name is the
    tool's name, the one the model calls. The loop opens a fresh instance for every call (create with the row's
    tools_kwargs[name].create_kwargs, execute with the parsed arguments, release, each awaited under
    multi_turn.tool_timeout), so no state spans calls; what a call raises is text the model reads, not an error of
    the run."""

    def __init__(self, config: dict, tool_schema: dict | None = None):
        self.config = config
        where = f"tool {type(self).__name__}"
        self.tool_schema = function_schema(tool_schema or self.get_openai_tool_schema(), where)
        self.name = self.tool_schema["function"]["name"]

    def get_openai_tool_schema(self) -> dict | None:
        """The schema when the tool config gives none."""
        return None

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Open an instance for one call: (its id, a response the loop does not show). kwargs: create_kwargs."""
        return instance_id or str(uuid.uuid4()), ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """Run the call with its JSON arguments: (the response the model reads, this call's reward or None, metrics).
        A reward is kept with the sample (extra_info's tool_rewards, for the reward function)."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """The instance's reward so far: verl's interface, for the tool's own use (the loop does not call it)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """The call is over (also after execute failed or timed out): free what the instance holds."""
