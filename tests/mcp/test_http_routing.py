"""Routing on the request headers over streamable HTTP (issue 22 item 2): a request the
headers already refuse opens no task and starts no upstream, whatever its body says; a
2026-07-28 client that names its task in a header is served without spillbox reading
its bodies, across requests (cursors and resource links keep working)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from mcp.client.streamable_http import streamable_http_client
from mcp_client import INITIALIZE, listening, processes_with, text_of, toy_server

from mcp import Client
from spillbox import Harness

pytest_plugins = ["mcp_fixtures"]

MODERN = "2026-07-28"
ACCEPT = {"Accept": "application/json, text/event-stream"}


def tools_list(task: str | None = None) -> dict[str, object]:
    """A 2026-07-28 tools/list as a client sends it (its envelope in _meta)."""
    meta: dict[str, object] = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    }
    if task is not None:
        meta["spillbox/task"] = task
    return {"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {"_meta": meta}}


def tasks_of(home: Path) -> list[str]:
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        return harness.tasks()


def test_requests_the_headers_refuse_open_no_task_and_start_no_upstream(home: Path) -> None:
    marker = f"routing-{uuid.uuid4().hex[:8]}"
    with listening(home, "proxy", "--", *toy_server(), marker=marker) as (url, _server):
        with httpx2.Client(headers=ACCEPT, timeout=30) as http:
            # 2026-07-28 without Mcp-Method, which the spec asks of every request.
            modern = {"MCP-Protocol-Version": MODERN, "Content-Type": "application/json"}
            body = json.dumps(tools_list("wanted"))
            refused = http.post(url, content=body, headers=modern)
            assert refused.status_code == 400, refused.text
            assert "mcp-method" in refused.json()["error"]["message"]
            # No session id, and a header that says this is no initialize: refused unread
            # (its body is an initialize).
            lying = {"Mcp-Method": "tools/list", "Content-Type": "application/json"}
            refused = http.post(url, content=json.dumps(INITIALIZE), headers=lying)
            assert refused.status_code == 400, refused.text
            assert "send initialize first" in refused.json()["error"]["message"]
            assert processes_with(marker) == []
            # The header that says initialize opens the session, as the body would.
            opened = http.post(
                url,
                content=json.dumps(INITIALIZE),
                headers={"Mcp-Method": "initialize", "Content-Type": "application/json"},
            )
            assert opened.status_code == 200, opened.text
            assert opened.headers.get("mcp-session-id")
    assert len(tasks_of(home)) == 1 and "wanted" not in tasks_of(home)


@pytest.mark.anyio
async def test_a_2026_client_naming_its_task_in_a_header_reads_links_in_later_requests(
    home: Path,
) -> None:
    """The Spillbox-Task header names the task (the body's _meta is then not read for
    it); each POST is served by that task's proxy: the link a notice gave in one request
    reads in the next, page after page."""
    # A start timeout with room for a loaded machine (8 s by default).
    args = ("proxy", "--upstream-start-timeout", "60", "--", *toy_server())
    with listening(home, *args) as (url, _server):
        async with (
            # The first request starts the upstream: httpx's 5 s default leaves no room
            # for a loaded machine (the SDK's own client waits 30 s).
            httpx2.AsyncClient(headers={"Spillbox-Task": "by-header"}, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http), mode=MODERN) as client,
        ):
            assert client.protocol_version == MODERN
            large = await client.call_tool("blob", {"size": 200_000})
            links = [b for b in large.content if isinstance(b, types.ResourceLink)]
            assert len(links) == 1, text_of(large)
            [link] = links
            [first] = (await client.read_resource(str(link.uri))).contents
            assert isinstance(first, types.TextResourceContents)
            page = json.loads(first.text)
            [second] = (await client.read_resource(page["next_uri"])).contents
            assert isinstance(second, types.TextResourceContents)
            echoed = await client.call_tool("echo", {"text": "still here"})
    assert str(link.uri).startswith("spillbox://by-header/blob_")
    assert json.loads(second.text)["position"]["start"] == page["position"]["end"]
    assert text_of(echoed) == "still here"
    assert tasks_of(home) == ["by-header"]


@pytest.mark.anyio
async def test_a_2026_calls_mcp_param_header_is_checked_against_its_argument(
    home: Path,
) -> None:
    """The toy's `region` declares its argument an x-mcp-header: the SDK's client sends
    Mcp-Param-Region with the call and is served; a call whose header says another region
    than its body is refused (400) before it reaches the upstream. The schema is the one
    the proxy last listed: the upstream is not asked for its tools per call."""
    listed = home / "listed"
    upstream = toy_server("--listed", str(listed))
    args = ("proxy", "--task", "shared", "--upstream-start-timeout", "60", "--", *upstream)
    with listening(home, *args) as (url, _server):
        async with Client(url, mode=MODERN) as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            served = await client.call_tool("region", {"region": "eu-west"})
        call = tools_list()
        call["method"] = "tools/call"
        call["params"] = {**call["params"], "name": "region", "arguments": {"region": "eu-west"}}  # type: ignore[dict-item]
        headers = {
            **ACCEPT,
            "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": "region",
        }
        async with httpx2.AsyncClient(timeout=60) as http:
            lying = await http.post(
                url, content=json.dumps(call), headers={**headers, "Mcp-Param-Region": "us-east"}
            )
            honest = await http.post(
                url, content=json.dumps(call), headers={**headers, "Mcp-Param-Region": "eu-west"}
            )
    assert "region" in names and text_of(served) == "eu-west"
    assert lying.status_code == 400, lying.text
    assert "Mcp-Param-Region" in lying.json()["error"]["message"]
    assert honest.status_code == 200, honest.text
    # Once as the task's first request connected it, once for the client's own listing.
    assert listed.read_text().count("tools/list") == 2
