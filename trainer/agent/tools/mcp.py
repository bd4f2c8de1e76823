"""MCP tools: a tool config entry with config.type mcp offers the model the tools of MCP servers, through the official
`mcp` SDK, in verl's format for them (verl 0.5 to 0.8's verl/tools/mcp_base_tool.py; verl 0.9 has none):

    tools:
      - class_name: verl.tools.mcp_base_tool.MCPBaseTool   # rlrig's port of it below, or a subclass of that
        config: {type: mcp, timeout: 30, rate_limit: 10}    # seconds to start and per call; calls per second
        mcp:
          mcp_servers_config_path: ./mcp_servers.json
          tool_selected_list: [calculator]                  # optional: else every tool the servers list

and the servers' file, JSON in the `mcpServers` format verl read through fastmcp:

    {"mcpServers": {
      "calc": {"command": "python", "args": ["-m", "pkg.server"], "env": {}, "cwd": "."},     # started, over stdio
      "docs": {"url": "http://127.0.0.1:8000/mcp", "headers": {}, "transport": "streamable-http"},  # or "sse"
      "tavily": {"url": "https://...", "auth_token": "..."}}}                  # verl's: SSE with a bearer token

Each process that loads the config (the driver for the prompts' schemas, each rollout worker for the calls) starts
its own stdio servers and connects to the URLs; each server's session lives on a thread of its own, so the loop's
calls, from any event loop, share it. Closing the tools (close_tools) or the process's exit stops the servers.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shlex
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .base import BaseTool, ToolResponse, function_schema

# a server's keys in the mcpServers file: a command's (stdio) or a url's; transport picks streamable-http or sse
SERVER_KEYS = {"command", "args", "env", "cwd", "url", "headers", "transport", "auth_token"}
MCP_KEYS = {"mcp_servers_config_path", "tool_selected_list"}  # verl's `mcp:` section
DEFAULT_TIMEOUT = 30.0  # verl's MCPBaseTool default
STOP_S = 10.0  # the SDK closes a stdio server's stdin, then terminates, then kills it: a few seconds at most


class ToolServerError(ConfigError):
    """An MCP server is gone mid-run: an error of the run, not a tool response the model reads."""


def mcp2openai(tool) -> dict:
    """verl's schema of an MCP tool (verl/tools/utils/mcp_clients/utils.py), from a `tools/list` entry."""
    params = dict(tool.input_schema)
    if not params.get("required"):
        params["required"] = []
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": params, "strict": False},
    }


def read_servers(path: str, where: str) -> dict[str, dict]:
    """The servers of an mcp_servers_config_path file, each checked to name a command or a url."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{where}: mcp.mcp_servers_config_path={path}: no such file")
    try:
        servers = json.loads(p.read_text()).get("mcpServers")
    except (json.JSONDecodeError, AttributeError):
        servers = None
    if not isinstance(servers, dict) or not servers or not all(isinstance(s, dict) for s in servers.values()):
        raise ConfigError(
            f'{where}: {path} must be JSON {{"mcpServers": {{name: {{"command": ...}} or {{"url": ...}}}}}}'
        )
    for name, spec in servers.items():
        unknown = sorted(set(spec) - SERVER_KEYS)
        if unknown:
            raise ConfigError(
                f"{where}: {path}: server {name}: {', '.join(unknown)} not read by rlrig; "
                f"a server's keys are {', '.join(sorted(SERVER_KEYS))}"
            )
        if ("command" in spec) == ("url" in spec):
            raise ConfigError(f"{where}: {path}: server {name} needs a command (stdio) or a url, one of them")
        transport = spec.get("transport")
        if "url" in spec and transport not in (None, "http", "streamable-http", "sse"):
            raise ConfigError(f"{where}: {path}: server {name}: transport={transport}; use streamable-http or sse")
    return servers


def leaf(error: BaseException) -> BaseException:
    """The first error inside nested exception groups (an anyio task group's)."""
    while getattr(error, "exceptions", None):
        error = error.exceptions[0]
    return error


@dataclass
class Server:
    """One server of the file, connected: its session (an mcp.Client) held open by a task on the servers' thread."""

    name: str
    spec: dict
    stderr: Any = None  # a stdio server's stderr, kept in a temporary file for the errors that name it
    client: Any = None
    ended: BaseException | None = None  # why its session ended, once it has
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None

    def describe(self) -> str:
        if "url" in self.spec:
            return f"MCP server {self.name} at {self.spec['url']}"
        return f"MCP server {self.name} (command: {shlex.join([self.spec['command'], *self.spec.get('args', [])])})"

    def last_stderr(self) -> str:
        if self.stderr is None:
            return ""
        fd = self.stderr.fileno()
        size = os.fstat(fd).st_size
        text = os.pread(fd, min(size, 4096), max(0, size - 4096)).decode(errors="replace")
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return f"; its last stderr line: {lines[-1]}" if lines else ""

    def transport(self):
        from mcp.client.sse import sse_client
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        s = self.spec
        if "command" in s:
            self.stderr = tempfile.TemporaryFile("w+")
            env = {k: str(v) for k, v in (s.get("env") or {}).items()}
            params = StdioServerParameters(
                command=s["command"], args=list(s.get("args", [])), env=env, cwd=s.get("cwd")
            )
            return stdio_client(params, errlog=self.stderr)
        headers = dict(s.get("headers") or {})
        if "auth_token" in s:
            headers["Authorization"] = f"Bearer {s['auth_token']}"
        sse = s.get("transport") == "sse" or (s.get("transport") is None and ("auth_token" in s or is_sse(s["url"])))
        if sse:
            return sse_client(s["url"], headers=headers)
        return streamable_http_client(s["url"], http_client=create_mcp_http_client(headers=headers))


def is_sse(url: str) -> bool:
    """fastmcp's reading of a url without a transport: an SSE endpoint's path ends in /sse."""
    from urllib.parse import urlparse

    return urlparse(url).path.rstrip("/").endswith("/sse")


class RateLimit:
    """verl's token bucket: at most `per_s` calls a second, a burst of up to `per_s`."""

    def __init__(self, per_s: float):
        self.per_s, self.tokens, self.last = per_s, per_s, time.monotonic()

    async def take(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens, self.last = min(self.per_s, self.tokens + (now - self.last) * self.per_s), now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.per_s)


_OPEN: weakref.WeakSet = weakref.WeakSet()  # closed at exit, so no server outlives its process


@atexit.register
def _close_all() -> None:
    for servers in list(_OPEN):
        servers.close()


class McpServers:
    """The servers of one mcp_servers_config_path, started (or connected) for this process on a thread of their own.
    `start` returns once each answered its tool listing, or raises a one-line ConfigError naming the one that did
    not; `call` runs a tool from any event loop; `close` stops every server and is safe to repeat."""

    def __init__(self, path: str, where: str, timeout: float, rate_limit: float | None):
        self.path, self.where, self.timeout = path, where, timeout
        self.servers = {name: Server(name, spec) for name, spec in read_servers(path, where).items()}
        self.by_tool: dict[str, Server] = {}
        self.listed: list = []  # the servers' tools (mcp Tool entries), once started
        self.rate = RateLimit(rate_limit) if rate_limit else None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="mcp servers", daemon=True)
        self.thread.start()
        _OPEN.add(self)

    def start(self) -> None:
        """Every server started and connected, and `listed` their tools, each server's in its order."""
        try:
            self.listed = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()
        except BaseException:
            self.close()
            raise

    async def _start(self) -> list:
        listed = await asyncio.gather(*(self._open(s) for s in self.servers.values()), return_exceptions=True)
        for server, result in zip(self.servers.values(), listed):
            if isinstance(result, BaseException):
                raise ConfigError(self._why_not_started(server, result)) from None
        tools = []
        for server, answer in zip(self.servers.values(), listed):
            for tool in answer:
                if tool.name in self.by_tool:
                    raise ConfigError(
                        f"{self.where}: {self.by_tool[tool.name].describe()} and {server.describe()} both offer a "
                        f"tool named {tool.name}; keep one of them (mcp.tool_selected_list or the servers' file)"
                    )
                self.by_tool[tool.name] = server
                tools.append(tool)
        return tools

    async def _open(self, server: Server) -> list:
        ready = self.loop.create_future()
        server.task = self.loop.create_task(self._hold(server, ready))
        await asyncio.wait_for(asyncio.shield(ready), self.timeout)
        listed, cursor = [], None
        while True:
            page = await asyncio.wait_for(server.client.list_tools(cursor=cursor), self.timeout)
            listed += page.tools
            cursor = page.next_cursor
            if not cursor:
                return listed

    async def _hold(self, server: Server, ready: asyncio.Future) -> None:
        """The server's session, open until close (the SDK's transports are entered and left in one task)."""
        from mcp import Client

        try:
            async with Client(server.transport(), read_timeout_seconds=self.timeout, cache=None) as client:
                server.client = client
                ready.set_result(None)
                await server.stop.wait()
        except BaseException as e:  # noqa: BLE001 -- kept for the error that names the server
            server.ended = leaf(e)
            if not ready.done():
                ready.set_exception(server.ended)
            if isinstance(e, asyncio.CancelledError):
                raise

    def _why_not_started(self, server: Server, error: BaseException) -> str:
        error = leaf(error)
        head = f"{self.where}: {server.describe()} did not start"
        if isinstance(error, asyncio.TimeoutError):
            stderr = server.last_stderr()
            return f"{head}: no answer within {self.timeout:g} s{stderr}; check it runs, or raise config.timeout"
        if isinstance(error, FileNotFoundError) and "command" in server.spec:
            return f"{head}: no command {server.spec['command']}; give a path or a program on PATH"
        fix = "check that it is up at that url" if "url" in server.spec else "check its command, args, env and cwd"
        return f"{head}: {describe_error(error)}{server.last_stderr()}; {fix}"

    def gone(self, server: Server, error: BaseException) -> ToolServerError:
        fix = "check that it stays up" if "url" in server.spec else "check why it exited"
        return ToolServerError(
            f"{self.where}: {server.describe()} is gone mid-run ({describe_error(error)}){server.last_stderr()}; {fix}"
        )

    async def call(self, name: str, arguments: dict, timeout: float):
        """The server's CallToolResult for one call, awaited from any event loop."""
        future = asyncio.run_coroutine_threadsafe(self._call(name, arguments, timeout), self.loop)
        return await asyncio.wrap_future(future)

    async def _call(self, name: str, arguments: dict, timeout: float):
        import anyio
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        server = self.by_tool[name]
        if server.ended is not None:
            raise self.gone(server, server.ended)
        if self.rate is not None:
            await self.rate.take()
        try:
            return await server.client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except MCPError as e:
            if e.code == CONNECTION_CLOSED:
                raise self.gone(server, e) from None
            raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError) as e:
            raise self.gone(server, e) from None

    def close(self) -> None:
        """Every server's session closed and its process stopped; the thread ended."""
        if self.loop.is_closed():
            return
        _OPEN.discard(self)
        if self.thread.is_alive():
            future = asyncio.run_coroutine_threadsafe(self._stop(), self.loop)
            try:
                future.result(STOP_S)
            except Exception:  # noqa: BLE001 -- a server that will not stop is killed with its session's task
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(STOP_S)
        if not self.thread.is_alive():
            self.loop.close()
        for server in self.servers.values():
            if server.stderr is not None:
                server.stderr.close()

    async def _stop(self) -> None:
        tasks = [s.task for s in self.servers.values() if s.task is not None and not s.task.done()]
        for server in self.servers.values():
            server.stop.set()
            if server.client is None and server.task is not None:  # still starting: nothing to finish
                server.task.cancel()
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_S - 1)
            for task in late:
                task.cancel()


def describe_error(error: BaseException) -> str:
    message = getattr(getattr(error, "error", None), "message", None) or str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class MCPBaseTool(BaseTool):
    """verl's MCPBaseTool: one tool of an MCP server, its schema the server's (mcp2openai). A subclass may override
    `_parse_tool_result(content) -> (text, metadata)` to read the server's content its own way (verl's default: the
    text parts joined by spaces). `servers` (the McpServers it calls through) is set by load_mcp_tools. A failed
    call is text the model reads, as in verl; a server gone mid-run is an error of the run (ToolServerError)."""

    servers: McpServers | None = None

    def __init__(self, config: dict, tool_schema: dict | None = None):
        super().__init__(config, tool_schema)
        self._instance_dict: dict[str, dict] = {}
        self.timeout = float(config.get("timeout", DEFAULT_TIMEOUT))

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id = instance_id or str(uuid.uuid4())
        self._instance_dict[instance_id] = {"response": "", "reward": []}
        return instance_id, ToolResponse()

    async def _call_tool(self, instance_id: str, parameters: dict) -> tuple[str, dict]:
        from mcp.shared.exceptions import MCPError

        try:
            result = await self.servers.call(self.name, parameters, self.timeout)
        except ToolServerError:
            raise
        except MCPError as e:
            return f"\n Tool call failed: {describe_error(e)}", {"api_request_error": describe_error(e)}
        except ConnectionError as e:
            return f"\n Connection failed: {e}", {"api_request_error": str(e)}
        text, metadata = self._parse_tool_result(result.content)
        return text, {**metadata, "api_request_error": None}

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        """The server's answer as the tool turn's text (verl: its text parts joined by spaces); reward 0."""
        if parameters is None:
            return ToolResponse(text=json.dumps({"result": "Error: 'parameters' is missing or empty."})), 0.0, {}
        text, metadata = await self._call_tool(instance_id, parameters)
        if instance_id in self._instance_dict:
            self._instance_dict[instance_id]["reward"].append(text.strip())
        metrics = {
            "query_count": metadata.get("query_count", 0),
            "status": metadata.get("status", "unknown"),
            "total_results": metadata.get("total_results", 0),
            "api_request_error": metadata.get("api_request_error"),
        }
        return ToolResponse(text=text), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs):
        """verl's: the instance's responses so far."""
        return self._instance_dict.get(instance_id, {}).get("reward", [])

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instance_dict.pop(instance_id, None)

    def _parse_tool_result(self, content: list) -> tuple[str, dict]:
        return " ".join(part.text for part in content if part.type == "text"), {}


def load_mcp_tools(entry: dict, cls: type, where: str, opened: dict[str, McpServers]) -> list[MCPBaseTool]:
    """An mcp entry's tools, each an instance of `cls` on its servers, which start here (once per servers' file in
    `opened`, as verl's one client manager does)."""
    try:
        import mcp.client  # noqa: F401
    except ImportError:
        raise ConfigError(f"{where}: config.type mcp needs the mcp package: pip install 'rlrig[mcp]'") from None
    if not (isinstance(cls, type) and issubclass(cls, MCPBaseTool)):
        raise ConfigError(
            f"{where}: config.type mcp needs class_name {MCPBaseTool.__module__}.MCPBaseTool or a subclass"
        )
    section, config = entry.get("mcp"), entry["config"]
    if not isinstance(section, dict) or not isinstance(section.get("mcp_servers_config_path"), str):
        raise ConfigError(f"{where}: config.type mcp needs mcp.mcp_servers_config_path (a JSON file of mcpServers)")
    unknown = sorted(set(section) - MCP_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: mcp.{unknown[0]} is not read by rlrig; the mcp section's keys are {sorted(MCP_KEYS)}"
        )
    selected = section.get("tool_selected_list")
    path = section["mcp_servers_config_path"]
    servers = opened.get(path)
    if servers is None:
        timeout = float(config.get("timeout", DEFAULT_TIMEOUT))
        servers = opened[path] = McpServers(path, where, timeout, config.get("rate_limit"))
        servers.start()
    tools = [t for t in servers.listed if not selected or t.name in selected]
    missing = sorted(set(selected or ()) - {t.name for t in servers.listed})
    if missing or not tools:
        offered = ", ".join(t.name for t in servers.listed) or "none"
        raise ConfigError(f"{where}: mcp.tool_selected_list names {missing or 'no tool'}; the servers offer {offered}")
    out = []
    for tool in tools:
        schema = function_schema(mcp2openai(tool), f"{where}: MCP tool {tool.name}")
        made = cls(config=config, tool_schema=schema)
        made.servers = servers
        out.append(made)
    return out
