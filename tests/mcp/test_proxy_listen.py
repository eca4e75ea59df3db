"""Clients over streamable HTTP (`spillbox mcp proxy --listen 127.0.0.1:PORT`, and `mcp
serve --listen`), driven by the SDK's own streamable HTTP client: one task and one upstream
per MCP session, the spec's session id, protocol version header and Origin check, and
sessions that end (DELETE, idle, SIGTERM) stopping their upstream and closing their task."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp_client import BIN, INITIALIZE, http_connect, listening, processes_with, text_of, toy_server
from toy_server import blob

from spillbox import Harness, ToolResult, parse_notice
from spillbox.mcp.http import listening_socket, parse_listen

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]


def post(
    url: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """A raw POST, as a browser page or a confused client would send it."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **(headers or {}),
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def task_states(home: Path) -> dict[str, str]:
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        return {row.task_id: row.state for row in harness.catalog.tasks()}


def wait_for(check: object, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


async def test_each_session_has_its_own_task_and_upstream_and_ends_with_them(home: Path) -> None:
    marker = "listen-sessions"
    with listening(home, "proxy", "--", *toy_server(), marker=marker) as (url, _):
        async with http_connect(url) as one, http_connect(url) as two:
            upstreams = processes_with(marker)
            results = []
            async with anyio.create_task_group() as group:
                for client, size in ((one, 300_000), (two, 400_000)):

                    async def call(client: ClientSession = client, size: int = size) -> None:
                        results.append((size, await client.call_tool("blob", {"size": size})))

                    group.start_soon(call)
            states_while_open = task_states(home)
        wait_for(lambda: not processes_with(marker))
        wait_for(lambda: set(task_states(home).values()) == {"closed"})
    assert len(upstreams) == 2, upstreams
    assert len(states_while_open) == 2 and set(states_while_open.values()) == {"open"}
    tasks = set()
    for size, result in results:
        notice = parse_notice(text_of(result))
        assert notice is not None, text_of(result)[:300]
        stored = anyio.Path(notice["path"])
        assert await stored.read_text() == blob(size)  # byte-exact
        tasks.add(stored.parts[-3])
    assert tasks == set(states_while_open), (tasks, states_while_open)


async def test_sessions_of_a_named_task_share_it(home: Path) -> None:
    with listening(home, "proxy", "--task", "shared", "--", *toy_server()) as (url, _):
        async with http_connect(url) as one:
            stored = parse_notice(text_of(await one.call_tool("blob", {"size": 300_000})))
            async with http_connect(url) as two:
                listed = json.loads(text_of(await two.call_tool("list_artifacts", {})))
    assert stored is not None
    assert [row["artifact_id"] for row in listed] == [stored["call_id"]]
    assert task_states(home) == {"shared": "closed"}


def test_requests_from_another_origin_or_host_or_version_are_refused(home: Path) -> None:
    with listening(home, "proxy", "--", *toy_server()) as (url, _):
        port = url.split(":")[2].split("/")[0]
        evil = post(url, INITIALIZE, {"Origin": "http://evil.example"})
        rebound = post(url, INITIALIZE, {"Host": f"evil.example:{port}"})
        version = post(url, INITIALIZE, {"MCP-Protocol-Version": "1999-01-01"})
        unknown = post(url, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, {"Mcp-Session-Id": "x"})
        no_session = post(url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        elsewhere = post(url.removesuffix("/mcp") + "/other", INITIALIZE)
        own = post(url, INITIALIZE, {"Origin": f"http://localhost:{port}"})
        states = task_states(home)
    assert evil[0] == 403
    assert rebound[0] == 421
    assert version[0] == 400 and "1999-01-01" in version[2]
    assert unknown[0] == 404
    assert no_session[0] == 400 and "initialize" in no_session[2]
    assert elsewhere[0] == 404
    # Only the one accepted initialize opened a task; the refused requests opened none.
    assert own[0] == 200 and own[1].get("mcp-session-id")
    assert len(states) == 1, states


def test_an_allowed_origin_is_served(home: Path) -> None:
    origin = "http://localhost:6274"
    with listening(home, "proxy", "--allow-origin", origin, "--", *toy_server()) as (url, _):
        status, headers, _ = post(url, INITIALIZE, {"Origin": origin})
    assert status == 200 and headers.get("mcp-session-id")


async def test_an_idle_session_ends_and_its_id_is_then_unknown(home: Path) -> None:
    marker = "listen-idle"
    args = ("proxy", "--session-timeout", "1", "--", *toy_server())
    with listening(home, *args, marker=marker) as (url, _):
        status, headers, _ = post(url, INITIALIZE)
        session_id = headers["mcp-session-id"]
        wait_for(lambda: not processes_with(marker))
        wait_for(lambda: set(task_states(home).values()) == {"closed"})
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        after = post(url, ping, {"Mcp-Session-Id": session_id})
    assert status == 200
    assert after[0] == 404


async def test_sigterm_ends_every_session_and_the_server(home: Path) -> None:
    marker = "listen-sigterm"
    with listening(home, "proxy", "--", *toy_server(), marker=marker) as (url, server):
        status, _, _ = post(url, INITIALIZE)
        post(url, INITIALIZE)
        assert len(processes_with(marker)) == 2
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    assert status == 200
    assert code == 0
    assert not processes_with(marker)
    states = task_states(home)
    assert len(states) == 2 and set(states.values()) == {"closed"}, states


async def test_serve_listens_over_a_tasks_payloads(home: Path) -> None:
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        with harness.task("written") as task:
            [admitted] = task.admit([ToolResult("rows", "rows", json.dumps([{"n": 1}] * 9000))])
    assert admitted.artifact is not None
    with listening(home, "serve", "--task", "written") as (url, _):
        async with http_connect(url) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            listed = json.loads(text_of(await client.call_tool("list_artifacts", {})))
    assert names == ["read_artifact", "list_artifacts", "search_artifacts"]
    assert [row["artifact_id"] for row in listed] == ["rows"]


def test_connections_are_served_with_nagles_algorithm_off() -> None:
    """uvicorn serves on spillbox's listening socket through asyncio, which turns Nagle's
    algorithm off only on connections of a socket that says it is TCP. With it on, a
    2026-07-28 echo call took 52 ms: the response's body, written after its headers,
    waited for the client's delayed ACK."""
    sock = listening_socket(parse_listen("127.0.0.1:0"))
    port = sock.getsockname()[1]

    async def accepted_nodelay() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Record(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                conn = transport.get_extra_info("socket")
                accepted.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Record, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            nodelay = await asyncio.wait_for(accepted, 60)
            writer.close()
        return nodelay

    assert asyncio.run(accepted_nodelay()) != 0


@pytest.mark.parametrize(
    "listen, wanted",
    [
        ("0.0.0.0:8931", "loopback address only"),
        ("example.com:8931", "loopback address only"),
        ("127.0.0.1", "give HOST:PORT"),
        ("127.0.0.1:99999", "give HOST:PORT"),
    ],
)
def test_a_listen_address_off_this_machine_is_refused_in_one_line(
    home: Path, listen: str, wanted: str
) -> None:
    done = run_cli(home, "proxy", "--listen", listen, "--", *toy_server())
    assert done.returncode != 0
    assert wanted in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command: Sequence[str] = [str(BIN / "spillbox"), "mcp", *args[:1], "--home", str(home)]
    return subprocess.run(
        [*command, "--sandbox", "none", *args[1:]], capture_output=True, text=True, timeout=60
    )
