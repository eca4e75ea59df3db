"""resources/read steered as read_artifact is: start, limit, records and fields in the
resource URI's query, through the proxy in front of tests/mcp/toy_server.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcp_client import connect, proxy_params, toy_server

from api_shapes import github_search
from spillbox.mcp.links import parse_uri

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]


async def read(session: Any, uri: str) -> dict[str, Any]:
    [contents] = (await session.read_resource(uri)).contents
    assert isinstance(contents, types.TextResourceContents)
    body: dict[str, Any] = json.loads(contents.text)
    return body


async def test_a_resource_read_takes_start_limit_and_fields_and_its_next_uri_keeps_them(
    home: Path,
) -> None:
    value = github_search(400)
    items = value["items"]
    async with connect(proxy_params(home, toy_server(), "--task", "steer")) as session:
        result = await session.call_tool("echo", {"text": json.dumps(value)})
        [link] = [b for b in result.content if isinstance(b, types.ResourceLink)]
        assert link.description is not None and "?start=40&limit=5" in link.description
        uri = str(link.uri)
        page = await read(session, f"{uri}?start=120&limit=3&fields=number&fields=title")
        assert page["items"] == [
            {"number": i["number"], "title": i["title"]} for i in items[120:123]
        ]
        assert page["position"] == {"start": 120, "end": 123} and page["returned"] == 3
        # The next page's URI carries a cursor that keeps the limit and the fields.
        after = await read(session, page["next_uri"])
        assert after["items"] == [
            {"number": i["number"], "title": i["title"]} for i in items[123:126]
        ]
        envelope = await read(session, f"{uri}?records=items")
        assert envelope["unit"] == "envelope" and envelope["total"] == 400
        for query, said in [
            ("start=400", "start 400 is past the end: this artifact has 400 records"),
            ("limit=0", "limit must be 1 to 1000"),
            ("start=ten", "start must be a whole number, not 'ten'"),
            ("fields=assignee", "no record has the key(s) assignee"),
            ("page=2", "unknown query parameter(s) page"),
            ("start=1&start=2", "start is given 2 times"),
        ]:
            with pytest.raises(MCPError, match=re.escape(said)):
                await read(session, f"{uri}?{query}")


def test_parse_uri_gives_read_artifacts_arguments() -> None:
    parsed = parse_uri("spillbox://t%2F1/c1?cursor=abc&fields=a&fields=b%2Cc&limit=5")
    assert parsed == (
        "t/1",
        "c1",
        {"cursor": "abc", "start": None, "limit": 5, "records": None, "fields": ["a", "b,c"]},
    )
    assert parse_uri("file:///tmp/x") is None
    with pytest.raises(ValueError, match="unknown query parameter"):
        parse_uri("spillbox://t/c1?x=1")
