"""verl's MCPSearchTool (verl/tools/mcp_search_tool.py): an MCP search server's answer (Tavily's, in verl's example)
read for its `results` list, with the queries and the results counted in the call's metrics."""

from __future__ import annotations

import re

from .mcp import MCPBaseTool


class MCPSearchTool(MCPBaseTool):
    """An MCP tool whose text parts each hold a search answer (`query` and `results`, in JSON or a Python repr):
    the tool turn is their `results` lists, concatenated, as verl reads them."""

    def _parse_tool_result(self, content: list) -> tuple[str, dict]:
        text, queries, found = "", [], 0
        for part in content:
            if part.type != "text":
                continue
            part_text = part.text.replace("'", '"')
            query = re.search(r'query"\s*:\s*"([^"]+)"', part_text)
            queries.append(query.group(1) if query else "")
            found += len(re.findall(r'"title"\s*:', part_text))
            results = re.search(r'"results"\s*:\s*(\[.*?\])', part_text, re.DOTALL)
            text += results.group(1) if results else ""
        metadata = {"api_request_error": "", "status": "success", "queries": queries}
        return text, {**metadata, "query_count": len(queries), "total_results": found}
