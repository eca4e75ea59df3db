"""The proxy in front of tests/mcp/toy_server.py: what real servers do only by chance."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp_client import appears, connect, memory_kb, proxy_params, proxy_pid, text_of, toy_server
from toy_server import blob

from mcp import Client
from spillbox import parse_notice
from spillbox.mcp.results import tool_result
from spillbox.steps import STEP_BOUND_SECONDS

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]

MEMORY_RATIO_MAX = 1.5
"""What a large result may add to the proxy's peak RSS, in multiples of its size: its
long text is spooled as bytes by the reader and stored as those bytes, held once
(benchmarks/mcp_bench.py measured 1.09 for 100 MB; 2.03 when it was parsed to a str)."""
LONG_TEXT = 5 * 2**20
"""Over the reader's SPOOL_LINE_BYTES: a line this long has its long strings spooled."""


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


async def test_a_call_left_unanswered_is_cancelled_upstream_after_the_timeout(
    home: Path, tmp_path: Path
) -> None:
    cancelled = tmp_path / "cancelled"
    server = toy_server("--cancelled", str(cancelled))
    async with connect(proxy_params(home, server, "--upstream-timeout", "1")) as session:
        with anyio.fail_after(20):
            result = await session.call_tool("never", {})
        assert result.is_error
        assert "no answer and no progress for 1 s" in text_of(result)
        await appears(cancelled)  # notifications/cancelled reached the server
        assert text_of(await session.call_tool("echo", {"text": "still here"})) == "still here"


async def test_an_upstream_that_exits_mid_call_is_reported_with_its_exit_status(
    home: Path,
) -> None:
    async with connect(proxy_params(home, toy_server())) as session:
        result = await session.call_tool("exit", {"status": 3})
        stored = await session.call_tool("list_artifacts", {})
    assert result.is_error
    assert "exited with status 3 during this call" in text_of(result), text_of(result)
    assert not stored.is_error


async def test_the_clients_ping_is_answered_by_spillbox_for_a_2026_upstream_and_after_exit(
    home: Path, tmp_path: Path
) -> None:
    """The toy server (the SDK's) speaks 2026-07-28 upstream, which has no ping: spillbox
    answers the client's ping itself, and after the upstream has exited."""
    pinged = tmp_path / "pinged"
    async with connect(proxy_params(home, toy_server("--pinged", str(pinged)))) as session:
        await session.send_ping()
        await session.call_tool("exit", {"status": 0})
        after_exit = await session.send_ping()
    assert not pinged.exists()
    assert after_exit == types.EmptyResult()


async def test_the_upstream_is_offered_exactly_the_clients_capabilities(home: Path) -> None:
    async def elicitation(ctx: Any, params: types.ElicitRequestParams) -> Any:
        return types.ElicitResult(action="decline")

    async def roots(ctx: Any) -> Any:
        return types.ListRootsResult(roots=[])

    declared = types.ClientCapabilities(
        elicitation=types.ElicitationCapability(form=types.FormElicitationCapability()),
        roots=types.RootsCapability(list_changed=False),
        experimental={"acme/feature": {"level": 2}},
    )
    async with connect(
        proxy_params(home, toy_server()),
        elicitation_callback=elicitation,
        list_roots_callback=roots,
    ) as plain:
        plain_seen = json.loads(text_of(await plain.call_tool("capabilities", {})))
    params = proxy_params(home, toy_server())
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        session._build_capabilities = lambda version: declared  # type: ignore[method-assign]
        await session.initialize()
        seen = json.loads(text_of(await session.call_tool("capabilities", {})))
    # The SDK client's own (elicitation form and url, roots with listChanged) pass as sent.
    assert plain_seen == {
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": True},
    }
    assert seen == declared.model_dump(by_alias=True, exclude_none=True)


async def test_the_clients_cancel_reaches_the_upstream(home: Path, tmp_path: Path) -> None:
    cancelled = tmp_path / "cancelled"
    async with connect(proxy_params(home, toy_server("--cancelled", str(cancelled)))) as session:
        with anyio.move_on_after(1):  # the SDK client sends notifications/cancelled
            await session.call_tool("never", {})
        await appears(cancelled)
        assert text_of(await session.call_tool("echo", {"text": "next"})) == "next"


async def test_a_2026_clients_cancel_reaches_the_upstream_through_its_round(
    home: Path, tmp_path: Path
) -> None:
    """A 2026-07-28 client's call runs in a round (spillbox.mcp.inputs): cancelling the
    request it waits on cancels the upstream's call, and the next call is answered."""
    cancelled = tmp_path / "cancelled"
    params = proxy_params(home, toy_server("--cancelled", str(cancelled)))
    async with Client(params, mode="2026-07-28") as client:
        # Its first request connects the upstream: a call cancelled before that never
        # reaches it, so the upstream is connected first.
        assert text_of(await client.call_tool("echo", {"text": "first"})) == "first"
        with anyio.move_on_after(1):
            await client.call_tool("never", {})
        await appears(cancelled)
        assert text_of(await client.call_tool("echo", {"text": "next"})) == "next"


async def test_a_finished_result_waits_for_its_step_at_most_the_step_bound(home: Path) -> None:
    """Two calls overlap: the quick one is held while the slow one runs, but only until
    STEP_BOUND_SECONDS after it finished; the slow one is then a step of its own."""
    answered: dict[str, float] = {}
    async with connect(proxy_params(home, toy_server())) as session:
        started = anyio.current_time()

        async def call(name: str, seconds: float) -> None:
            result = await session.call_tool("sleep", {"seconds": seconds, "text": name})
            assert text_of(result) == name
            answered[name] = anyio.current_time() - started

        async with anyio.create_task_group() as group:
            group.start_soon(call, "slow", STEP_BOUND_SECONDS + 4)
            await anyio.sleep(0.2)
            group.start_soon(call, "quick", 0)
    assert STEP_BOUND_SECONDS <= answered["quick"] < STEP_BOUND_SECONDS + 2, answered
    assert answered["slow"] >= STEP_BOUND_SECONDS + 4, answered


async def test_a_100_mb_result_is_offloaded_with_the_proxys_memory_bounded(home: Path) -> None:
    size = 100 * 2**20
    async with connect(proxy_params(home, toy_server())) as session:
        pid = proxy_pid()
        await session.call_tool("blob", {"size": 200_000})  # the offload path's first use
        before = memory_kb(pid, "VmRSS") * 1024
        with anyio.fail_after(120):
            result = await session.call_tool("blob", {"size": size})
        peak = memory_kb(pid, "VmHWM") * 1024
    notice = parse_notice(text_of(result))
    assert notice is not None and notice["bytes"] == str(size), text_of(result)
    stored = await anyio.Path(notice["path"]).read_bytes()
    assert stored == blob(size).encode()
    assert peak - before < MEMORY_RATIO_MAX * size, (before, peak, (peak - before) / size)


async def test_a_long_tool_result_kept_in_context_reaches_the_client_whole(home: Path) -> None:
    """A long text the reader spooled, under limits that keep it in context, goes back to
    the client as the server sent it."""
    limits = {"SPILLBOX_PER_CALL_TOKENS": "50000000", "SPILLBOX_AGGREGATE_TOKENS": "50000000"}
    params = proxy_params(home, toy_server()).model_copy(update={"env": limits})
    async with connect(params) as session:
        result = await session.call_tool("blob", {"size": LONG_TEXT})
    assert parse_notice(text_of(result)) is None
    assert [b.text for b in result.content if isinstance(b, types.TextContent)] == [blob(LONG_TEXT)]


async def test_long_answers_other_than_a_tool_result_reach_the_client_whole(home: Path) -> None:
    """A resource's text and blob and a prompt's message, long enough to be spooled by the
    reader, reach the client as the server sent them: only a tool result is gated."""
    text = blob(LONG_TEXT)
    upstream = toy_server("--resource-size", str(LONG_TEXT))
    async with connect(proxy_params(home, upstream)) as session:
        read = await session.read_resource("toy://config")
        prompt = await session.get_prompt("configure")
    as_text, as_blob = read.contents
    assert isinstance(as_text, types.TextResourceContents) and as_text.text == text
    assert isinstance(as_blob, types.BlobResourceContents)
    assert base64.b64decode(as_blob.blob) == text.encode()
    [message] = prompt.messages
    assert isinstance(message.content, types.TextContent) and message.content.text == text


async def test_an_offloaded_result_links_its_payload_and_resources_read_pages_it(
    home: Path,
) -> None:
    async with connect(proxy_params(home, toy_server(), "--task", "linked")) as session:
        result = await session.call_tool("blob", {"size": 100_000})
        [link] = [b for b in result.content if isinstance(b, types.ResourceLink)]
        listed = await session.list_resources()
        pages: list[dict[str, Any]] = []
        uri: str | None = str(link.uri)
        while uri is not None:
            [contents] = (await session.read_resource(uri)).contents
            assert isinstance(contents, types.TextResourceContents)
            pages.append(json.loads(contents.text))
            uri = pages[-1]["next_uri"]
        with pytest.raises(MCPError, match="task other"):
            await session.read_resource("spillbox://other/blob_1")
    notice = parse_notice(text_of(result))
    assert notice is not None
    assert link.uri == "spillbox://linked/blob_1" and link.size == 100_000
    assert link.mime_type == "text/plain"
    assert [str(r.uri) for r in listed.resources] == [link.uri]
    assert len(pages) > 1  # each page under the per-call limit
    stored = await anyio.Path(notice["path"]).read_text()
    assert "".join(page["text"] for page in pages) == stored
