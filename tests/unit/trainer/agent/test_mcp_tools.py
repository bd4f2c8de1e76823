"""MCP tools (config.type mcp) through the official SDK against the embedded calculator server, over stdio and
over streamable HTTP and SSE: the schemas verl builds from a server's tool listing, each call's text as verl reads
it, and a server that fails to start, dies mid-run or refuses its url as one-line errors, no process left behind."""

import asyncio
import json
import socket
import subprocess
import sys
import time

import mcp_types
import psutil
import pytest

from rlrig.trainer.agent.loop import call_tool
from rlrig.trainer.agent.rollout import AgentRollout
from rlrig.trainer.agent.tool_parser import FunctionCall
from rlrig.trainer.agent.tools import close_tools, load_tools
from rlrig.trainer.agent.tools.base import function_schema
from rlrig.trainer.agent.tools.mcp import ToolServerError, mcp2openai
from rlrig.trainer.errors import ConfigError
from tests.unit.trainer.agent.test_loop import EOS, TOK, Cfg, ScriptedEngine, call, decode_parts, row

SERVER = [sys.executable, "-m", "rlrig.trainer.agent.tools.calculator_server"]
CALC_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluates an arithmetic expression (+ - * / // % ** and parentheses)",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        "strict": False,
    },
}


def children() -> list:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running() and p.status() != "zombie"]


@pytest.fixture(autouse=True)
def no_process_left_behind():
    before = {p.pid for p in children()}
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [p for p in children() if p.pid not in before]:
        time.sleep(0.1)
    assert [p.cmdline() for p in children() if p.pid not in before] == []


def config(tmp_path, servers: dict, **mcp) -> str:
    (tmp_path / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    entry = {
        "class_name": "verl.tools.mcp_base_tool.MCPBaseTool",
        "config": {"type": "mcp", "timeout": mcp.pop("timeout", 30)},
        "mcp": {"mcp_servers_config_path": str(tmp_path / "servers.json"), **mcp},
    }
    path = tmp_path / "tools.yaml"
    path.write_text(json.dumps({"tools": [entry]}))
    return str(path)


def stdio(*args: str) -> dict:
    return {"command": args[0], "args": list(args[1:])}


def run(tool, arguments):
    async def go():
        instance, _ = await tool.create()
        try:
            return await tool.execute(instance, arguments)
        finally:
            await tool.release(instance)

    return asyncio.run(go())


# verl's schema (mcp2openai, then OpenAIFunctionToolSchema dumped without unset and None fields): these expected
# values are what verl 0.8's code gives for the same listings
@pytest.mark.parametrize(
    "input_schema, parameters",
    [
        (  # the SDK's own listing of a function: titles dropped
            {"type": "object", "properties": {"x": {"title": "X", "type": "string"}}, "required": ["x"], "title": "f"},
            {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        ),
        ({"type": "object", "properties": {}}, {"type": "object", "properties": {}, "required": []}),
        (  # description and enum kept; items, default, additionalProperties dropped
            {
                "type": "object",
                "properties": {
                    "q": {"type": "string", "description": "what to find"},
                    "k": {"type": "integer", "default": 3},
                    "mode": {"type": "string", "enum": ["web", "news"]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["q"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {
                    "q": {"type": "string", "description": "what to find"},
                    "k": {"type": "integer"},
                    "mode": {"type": "string", "enum": ["web", "news"]},
                    "tags": {"type": "array"},
                },
                "required": ["q"],
            },
        ),
    ],
)
def test_a_listed_tools_schema_is_the_one_verl_builds(input_schema, parameters):
    tool = mcp_types.Tool(name="f", description="does f", input_schema=input_schema)
    schema = function_schema(mcp2openai(tool), "here")
    assert schema == {
        "type": "function",
        "function": {"name": "f", "description": "does f", "parameters": parameters, "strict": False},
    }


@pytest.mark.parametrize(
    "description, input_schema, says",
    [
        (None, {"type": "object", "properties": {}}, "description must be a string"),
        ("d", {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}]}}}, "properties.x needs a type"),
    ],
)
def test_a_listed_tool_verl_could_not_read_is_refused_in_one_line(description, input_schema, says):
    tool = mcp_types.Tool(name="f", description=description, input_schema=input_schema)
    with pytest.raises(ConfigError, match=says) as e:
        function_schema(mcp2openai(tool), "MCP tool f")
    assert "\n" not in str(e.value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    """The calculator served over a url: (transport) -> its url, the server stopped after the test."""
    started = []

    def start(transport: str) -> str:
        port = free_port()
        proc = subprocess.Popen([*SERVER, "--transport", transport, "--port", str(port)], stderr=subprocess.DEVNULL)
        started.append(proc)
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert proc.poll() is None and time.monotonic() < deadline, "the calculator server did not come up"
            time.sleep(0.1)
        return f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}"

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("transport", ["stdio", "streamable-http", "sse"])
def test_the_calculator_servers_tool_is_offered_and_called(tmp_path, http_server, transport):
    server = stdio(*SERVER) if transport == "stdio" else {"url": http_server(transport)}
    tools = load_tools(config(tmp_path, {"calc": server}))
    try:
        assert list(tools) == ["calculator"] and tools["calculator"].tool_schema == CALC_SCHEMA
        response, reward, metrics = run(tools["calculator"], {"expression": "37*48"})
        assert (response.text, reward, metrics["api_request_error"]) == ("1776", 0.0, None)
        # the tool's own error is its text, as the server sends it
        assert run(tools["calculator"], {"expression": "x"})[0].text.endswith("not arithmetic: x")
    finally:
        close_tools(tools)
    close_tools(tools)  # again: nothing left to do


def test_tool_selected_list_keeps_the_named_tools_and_refuses_unknown_ones(tmp_path):
    tools = load_tools(config(tmp_path, {"calc": stdio(*SERVER)}, tool_selected_list=["calculator"]))
    close_tools(tools)
    assert list(tools) == ["calculator"]
    with pytest.raises(ConfigError, match=r"tool_selected_list names \['search'\]; the servers offer calculator"):
        load_tools(config(tmp_path, {"calc": stdio(*SERVER)}, tool_selected_list=["search"]))


BOOM = "import sys; print('Traceback ...', file=sys.stderr); print('ImportError: no module boom', file=sys.stderr)"


@pytest.mark.parametrize(
    "servers, timeout, says",
    [
        (
            {"calc": stdio(sys.executable, "-c", BOOM + "; sys.exit(3)")},
            30,
            r"MCP server calc \(command: .*\) did not start: MCPError: Connection closed; its last stderr line: "
            r"ImportError: no module boom; check its command, args, env and cwd",
        ),
        ({"calc": stdio("no-such-mcp-server")}, 30, "MCP server calc .* did not start: no command no-such-mcp-server"),
        (
            {"calc": stdio(sys.executable, "-c", "import time; time.sleep(60)")},
            1,
            r"did not start: no answer within 1 s; check it runs, or raise config.timeout",
        ),
        (
            {"docs": {"url": "http://127.0.0.1:{port}/mcp"}},
            30,
            r"MCP server docs at http://127.0.0.1:\d+/mcp did not start: ConnectError: .*; check that it is up",
        ),
        ({"calc": {"command": "x", "url": "http://h"}}, 30, "server calc needs a command .* or a url, one of them"),
        ({"docs": {"url": "http://h", "transport": "ws"}}, 30, "transport=ws; use streamable-http or sse"),
        ({"docs": {"url": "http://h", "keep_alive": True}}, 30, "server docs: keep_alive not read by rlrig"),
    ],
)
def test_a_server_that_does_not_start_is_one_line_naming_it(tmp_path, servers, timeout, says):
    servers = json.loads(json.dumps(servers).replace("{port}", str(free_port())))
    start = time.monotonic()
    with pytest.raises(ConfigError, match=says) as e:
        load_tools(config(tmp_path, servers, timeout=timeout))
    assert "\n" not in str(e.value) and time.monotonic() - start < timeout + 15


def test_a_servers_file_that_is_not_there_or_not_mcpservers_is_refused(tmp_path):
    path = config(tmp_path, {})
    with pytest.raises(ConfigError, match=r'must be JSON \{"mcpServers"'):
        load_tools(path)
    (tmp_path / "servers.json").unlink()
    with pytest.raises(ConfigError, match="mcp_servers_config_path=.*: no such file"):
        load_tools(path)


def test_a_server_that_dies_mid_run_ends_the_run_naming_it(tmp_path):
    tools = load_tools(config(tmp_path, {"calc": stdio(*SERVER)}))
    try:
        for proc in children():
            proc.kill()
            proc.wait()
        call = FunctionCall("calculator", json.dumps({"expression": "1+1"}))
        with pytest.raises(ToolServerError, match=r"MCP server calc \(command: .*\) is gone mid-run") as e:
            asyncio.run(call_tool(tools["calculator"], call, {}, 30.0))  # the loop lets it through
        assert "\n" not in str(e.value)
    finally:
        close_tools(tools)


def test_one_rollout_step_calls_the_mcp_server_and_its_result_is_the_tool_turn(tmp_path):
    """The embedded tool model's call, through verl's loop (the rollout's AgentRollout over a scripted engine) to the
    MCP calculator and back: the tool turn is the server's answer, masked out of the model's tokens."""
    engine = ScriptedEngine({"37*48=": call("37*48"), "</tool_response>": f"#### 1776{EOS}"})
    agent = AgentRollout(engine, TOK, Cfg(config(tmp_path, {"calc": stdio(*SERVER)})))
    try:
        ro, stats = agent.generate([row("37*48=")], 2)
    finally:
        close_tools(agent.loop.tools)
    for i, t in enumerate(stats.trajs):
        assert t.tool_calls == 1 and t.messages[-2] == {"role": "tool", "content": "1776"}
        whole, own = decode_parts(ro, i)
        assert whole == f"{call('37*48')}<tool_response>1776</tool_response>#### 1776{EOS}"
        assert own == f"{call('37*48')}#### 1776{EOS}"  # the server's answer is not the model's to learn


def test_an_unknown_key_of_the_mcp_section_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="mcp.tool_list is not read by rlrig; the mcp section's keys are"):
        load_tools(config(tmp_path, {"calc": stdio(*SERVER)}, tool_list=["calculator"]))


def test_verls_mcp_search_tool_reads_a_search_answers_results():
    """verl's example config's class (verl.tools.mcp_search_tool.MCPSearchTool), on a Tavily-like answer."""
    from rlrig.trainer.agent.tools import VERL_PORTS
    from rlrig.trainer.agent.tools.mcp_search import MCPSearchTool

    assert VERL_PORTS["verl.tools.mcp_search_tool.MCPSearchTool"].endswith("mcp_search.MCPSearchTool")
    tool = MCPSearchTool({"type": "mcp"}, CALC_SCHEMA)
    answer = "{'query': 'rl', 'results': [{'title': 'a', 'url': 'u'}, {'title': 'b', 'url': 'v'}]}"
    image = mcp_types.ImageContent(type="image", data="", mime_type="image/png")
    parts = [mcp_types.TextContent(type="text", text=answer), image]
    text, metadata = tool._parse_tool_result(parts)
    assert text == '[{"title": "a", "url": "u"}, {"title": "b", "url": "v"}]'
    assert (metadata["queries"], metadata["query_count"], metadata["total_results"]) == (["rl"], 1, 2)
