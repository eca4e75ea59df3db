"""The proxy in front of tests/mcp/toy_server.py: what real servers do only by chance."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp_client import connect, proxy_params, toy_server

from spillbox import parse_notice
from spillbox.mcp.results import tool_result

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def counted(text: str | None, structured: dict[str, object] | None) -> str | bytes:
    content: list[types.ContentBlock] = [] if text is None else [types.TextContent(text=text)]
    result = types.CallToolResult(content=content, structured_content=structured)
    return tool_result("c1", "t", result).content


def test_structured_content_that_repeats_the_text_counts_once() -> None:
    text = "line\n" * 1000
    assert counted(text, {"content": text}) == text  # server-filesystem
    table = {"rows": [1, 2, 3]}
    assert counted(json.dumps(table, indent=2), table) == json.dumps(table, indent=2)
    assert counted(None, table) == json.dumps(table)
    assert counted(text, None) == text


def test_structured_content_beyond_the_text_is_counted_with_it() -> None:
    table = {"rows": list(range(1000))}
    both = counted("1000 rows", table)
    assert json.loads(both) == {"text": "1000 rows", "structuredContent": table}
    text = "x" * 100
    bigger = {"content": text, "more": "y" * 1000}  # holds the text, and much besides
    assert json.loads(counted(text, bigger))["structuredContent"] == bigger


async def test_a_large_structured_content_behind_a_short_text_is_offloaded(home: Path) -> None:
    async with connect(proxy_params(home, toy_server())) as session:
        result = await session.call_tool("wide", {"rows": 20_000})
        small = await session.call_tool("wide", {"rows": 3})
    notice = parse_notice(text_of(result))
    assert notice is not None, text_of(result)
    assert notice["reason"].startswith("per_call")
    assert result.structured_content is None  # replaced with the text (no outputSchema)
    stored = json.loads(await anyio.Path(notice["path"]).read_text())
    assert stored["text"] == "20000 rows"
    assert len(stored["structuredContent"]["rows"]) == 20_000
    assert text_of(small) == "3 rows" and small.structured_content is not None
