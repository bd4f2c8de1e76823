"""The calculator as an MCP server (the embedded demonstration of `type: mcp` tools), on the official SDK's MCPServer
(FastMCP in mcp 1.x): `python -m rlrig.trainer.agent.tools.calculator_server` serves one tool, `calculator`, over
stdio, with the built-in calculator's arithmetic, so the tool task's model calls it exactly as it calls the built-in
one. `--transport streamable-http --port N` serves it at http://127.0.0.1:N/mcp instead, `--transport sse` at
http://127.0.0.1:N/sse."""

from __future__ import annotations

import argparse

from .calculator import evaluate, shown


def build():
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("rlrig-calculator", log_level="WARNING")

    @server.tool()
    def calculator(expression: str) -> str:
        """Evaluates an arithmetic expression (+ - * / // % ** and parentheses)"""
        try:
            return shown(evaluate(expression))
        except (ValueError, ArithmeticError) as e:  # the model reads why, as from the built-in calculator
            raise ToolError(str(e)) from None

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["stdio", "streamable-http", "sse"], default="stdio")
    parser.add_argument("--port", type=int, default=8000, help="for streamable-http and sse, on 127.0.0.1")
    args = parser.parse_args(argv)
    server = build()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run(args.transport, host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
