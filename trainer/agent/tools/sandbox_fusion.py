"""verl's code-interpreter tool (verl.tools.sandbox_fusion_tools.SandboxFusionTool, the retool recipe's): the model
sends code, a SandboxFusion service (or `rlrig sandbox`) runs it, and the model reads its stdout and stderr.

Its config, as verl's: sandbox_fusion_url (required: the service's /run_code URL), memory_limit_mb (1024),
default_timeout (30 s), default_language (python), rate_limit (10: calls in flight at once). verl bounds
rate_limit across the whole cluster through one Ray actor; rlrig bounds it in each rollout process. num_workers and
enable_global_rate_limit are taken and change nothing here (the calls run on the event loop's threads)."""

from __future__ import annotations

import asyncio

from ...errors import ConfigError
from ...reward.sandbox_fusion import SandboxClient
from .base import BaseTool, ToolResponse


class SandboxFusionTool(BaseTool):
    """`code_interpreter(code[, timeout][, language])`: the code's stdout then stderr where it ran to its end (any
    exit code), "no stdout here" where it did not (a time limit, a compile error, the service unreachable). No
    reward of its own."""

    def __init__(self, config: dict, tool_schema: dict | None = None):
        super().__init__(config, tool_schema)
        url = config.get("sandbox_fusion_url") or ""
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"tool {self.name}: config.sandbox_fusion_url={url!r} must be a SandboxFusion /run_code URL "
                "(run `rlrig sandbox` for one on this machine)"
            )
        self.default_timeout = config.get("default_timeout", 30)
        self.default_language = config.get("default_language", "python")
        self.client = SandboxClient.of(url, int(config.get("rate_limit", 10)), int(config.get("memory_limit_mb", 1024)))

    def get_openai_tool_schema(self) -> dict:
        """verl's schema in its docstring, for a tool config that gives none."""
        return {
            "type": "function",
            "function": {
                "name": "code_interpreter",
                "description": "A tool for execute code",
                "parameters": {
                    "type": "object",
                    "properties": {"code": {"type": "string", "description": "code needs to be execute and grad"}},
                    "required": ["code"],
                },
            },
        }

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[ToolResponse, float | None, dict]:
        code = parameters.get("code", "")
        timeout = parameters.get("timeout", self.default_timeout)
        language = parameters.get("language", self.default_language)
        answer, _ = await asyncio.to_thread(self.client.run, str(code), None, timeout, language)
        ran = (answer or {}).get("run_result") or {}
        if ran.get("status") == "Finished":
            return ToolResponse(text=(ran.get("stdout") or "") + (ran.get("stderr") or "")), None, {}
        return ToolResponse(text="no stdout here"), None, {}
