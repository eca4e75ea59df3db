"""How `spillbox mcp proxy --listen` answers a 2025-era session's requests
(spillbox.mcp.deferred): with one JSON body when only the answer comes, on an SSE stream
when a progress notification (or a request to the client, tests/mcp/test_input_requests)
comes first or the answer is later than the deferral window."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_loop
from mcp_client import http_connect, listening, npm_server, text_of, toy_server

from spillbox.mcp import deferred
from spillbox.mcp.deferred import DeferredSSETransport

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]

ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}


async def opened(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    """A session opened at url with initialize; the headers each later request carries."""
    response = await client.post(url, json=INITIALIZE, headers=ACCEPT)
    assert response.status_code == 200, response.text
    headers = {
        **ACCEPT,
        "mcp-session-id": response.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-11-25",
    }
    assert (await client.post(url, json=INITIALIZED, headers=headers)).status_code == 202
    return headers


def sse_messages(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]


async def test_an_answer_that_comes_alone_is_one_json_body(home: Path) -> None:
    with listening(home, "proxy", "--", *toy_server()) as (url, _):
        async with httpx.AsyncClient(timeout=60) as client:
            headers = await opened(client, url)
            echoed = await client.post(url, json=call(1, "echo", {"text": "hi"}), headers=headers)
            unknown = await client.post(url, json=call(2, "nosuch", {}), headers=headers)
    assert echoed.headers["content-type"] == "application/json"
    assert echoed.json()["id"] == 1
    assert echoed.json()["result"]["content"][0]["text"] == "hi"
    assert unknown.headers["content-type"] == "application/json"
    assert unknown.json()["id"] == 2 and unknown.json()["error"]["message"]


async def test_progress_comes_on_an_sse_stream_before_the_answer(
    npm_servers: Path, home: Path
) -> None:
    command = npm_server(npm_servers, "mcp-server-everything")
    with listening(home, "proxy", "--", *command) as (url, _):
        async with httpx.AsyncClient(timeout=60) as client:
            headers = await opened(client, url)
            request = call(1, "trigger-long-running-operation", {"duration": 1, "steps": 3})
            request["params"]["_meta"] = {"progressToken": "p1"}
            streamed = await client.post(url, json=request, headers=headers)
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        async with http_connect(url) as session:  # and the SDK's client reads it so
            long = await session.call_tool(
                "trigger-long-running-operation",
                {"duration": 1, "steps": 3},
                progress_callback=on_progress,
            )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    messages = sse_messages(streamed.text)
    methods = [m.get("method") for m in messages[:-1]]
    assert methods and all(m == "notifications/progress" for m in methods), messages
    assert messages[-1]["id"] == 1 and "result" in messages[-1]
    assert not long.is_error and progress == [1, 2, 3]


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    """A tool of any name: answers its name after `seconds`."""
    await anyio.sleep(float((params.arguments or {}).get("seconds", 0)))
    return types.CallToolResult(content=[types.TextContent(text=params.name)])


Tool = Callable[[Any, types.CallToolRequestParams], Awaitable[types.CallToolResult]]


@asynccontextmanager
async def in_process(
    tool: Tool = call_tool,
) -> AsyncIterator[tuple[httpx.AsyncClient, str, dict[str, str]]]:
    """A session of DeferredSSETransport in this process, in front of a Server whose
    every tool is tool: an HTTP client for it, its URL and the headers of a request in
    the session."""
    server: Server[Any] = Server("slow", on_call_tool=tool)
    transport = DeferredSSETransport(mcp_session_id="s1", security_settings=None)
    url = "http://127.0.0.1/mcp"
    async with (
        transport.connect() as (read, write),
        anyio.create_task_group() as group,
        server.lifespan(server) as state,
    ):
        group.start_soon(
            lambda: serve_loop(server, read, write, lifespan_state=state, session_id="s1")
        )
        asgi = httpx.ASGITransport(app=transport.handle_request)
        async with httpx.AsyncClient(transport=asgi) as client:
            yield client, url, await opened(client, url)
        group.cancel_scope.cancel()


async def test_an_answer_later_than_the_deferral_window_comes_on_an_sse_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In process, the window shortened: the SSE stream is opened when it passes, and the
    answer comes on it; a quick answer in the same session is still JSON."""
    monkeypatch.setattr(deferred, "DEFERRAL_SECONDS", 0.05)
    async with in_process() as (client, url, headers):
        slow = await client.post(url, json=call(1, "slow", {"seconds": 0.5}), headers=headers)
        monkeypatch.setattr(deferred, "DEFERRAL_SECONDS", 60.0)  # room for a loaded machine
        quick = await client.post(url, json=call(2, "quick", {}), headers=headers)
    assert slow.headers["content-type"].startswith("text/event-stream")
    assert sse_messages(slow.text)[-1]["result"]["content"][0]["text"] == "slow"
    assert quick.headers["content-type"] == "application/json"
    assert text_of(types.CallToolResult.model_validate(quick.json()["result"])) == "quick"


async def test_a_request_whose_id_is_in_flight_is_refused_and_the_first_is_answered() -> None:
    """Answers are routed by id: a second request under an id still in flight would take
    the first one's answer and leave it none. It is refused (409); the first is answered."""
    entered, release = anyio.Event(), anyio.Event()

    async def held(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "held":
            entered.set()
            await release.wait()
        return await call_tool(ctx, params)

    answers: dict[str, httpx.Response] = {}
    async with in_process(held) as (client, url, headers):

        async def send(label: str, request: dict[str, Any]) -> None:
            answers[label] = await client.post(url, json=request, headers=headers)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(send, "held", call(5, "held", {}))
                await entered.wait()
                await send("again", call(5, "other", {}))
                release.set()
        later = await client.post(url, json=call(5, "reused", {}), headers=headers)
    assert answers["again"].status_code == 409
    assert "in flight" in answers["again"].json()["error"]["message"]
    assert answers["held"].json()["result"]["content"][0]["text"] == "held"
    assert later.json()["result"]["content"][0]["text"] == "reused"  # once answered, free


@pytest.mark.parametrize("bad_id", [{"a": 1}, [1], True, 1.5, None], ids=repr)
async def test_a_request_whose_id_is_no_string_or_integer_gets_invalid_request(
    bad_id: object,
) -> None:
    """The SDK takes such a request for a notification: 202, nothing run, no answer ever
    (a client waits forever). JSON-RPC asks for Invalid Request; the session goes on."""
    ran: list[str] = []

    async def counted(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        ran.append(params.name)
        return await call_tool(ctx, params)

    async with in_process(counted) as (client, url, headers):
        refused = await client.post(url, json={**call(1, "bad", {}), "id": bad_id}, headers=headers)
        fine = await client.post(url, json=call(2, "fine", {}), headers=headers)
    assert refused.status_code == 400
    error = refused.json()
    assert error["id"] is None and error["error"]["code"] == types.INVALID_REQUEST
    assert "id must be a string or an integer" in error["error"]["message"]
    assert fine.json()["result"]["content"][0]["text"] == "fine"
    assert ran == ["fine"]
