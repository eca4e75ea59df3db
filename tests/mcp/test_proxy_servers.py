"""server-filesystem and server-everything (npm) behind the proxy."""

from __future__ import annotations

import json
import os
import signal
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp_client import (
    connect,
    http_connect,
    listening,
    npm_server,
    processes_with,
    proxy_params,
    text_of,
)

from spillbox import Harness, parse_notice

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]


@pytest.fixture
def big_tree(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for a in range(20):
        for b in range(15):
            folder = root / f"module_{a}" / f"package_{b}"
            folder.mkdir(parents=True)
            for c in range(6):
                (folder / f"source_file_{c}.py").write_text("x = 1\n")
    lines = [json.dumps({"id": n, "name": f"user {n}", "team": f"t{n % 9}"}) for n in range(40_000)]
    (root / "users.ndjson").write_text("\n".join(lines) + "\n")
    return root


async def test_filesystem_results_keep_their_output_schema(
    npm_servers: Path, big_tree: Path, home: Path
) -> None:
    """Every tool of server-filesystem declares an outputSchema: the SDK client validates
    the gated results against it (call_tool raises if they do not conform)."""
    server = npm_server(npm_servers, "mcp-server-filesystem", str(big_tree))
    async with connect(proxy_params(home, server)) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert tools["directory_tree"].output_schema is not None
        tree = await session.call_tool("directory_tree", {"path": str(big_tree)})
        big_file = await session.call_tool(
            "read_text_file", {"path": str(big_tree / "users.ndjson")}
        )
        small = await session.call_tool("list_allowed_directories", {})
    for result in (tree, big_file):
        assert not result.is_error
        notice = parse_notice(text_of(result))
        assert notice is not None
        assert result.structured_content == {"content": text_of(result)}
    stored = await anyio.Path(parse_notice(text_of(big_file))["path"]).read_text()  # type: ignore[index]
    assert stored == (big_tree / "users.ndjson").read_text()
    assert parse_notice(text_of(small)) is None
    assert small.structured_content == {"content": text_of(small)}


@pytest.mark.parametrize("client", ["stdio", "http"])
async def test_everything_progress_sampling_elicitation_roots(
    npm_servers: Path, home: Path, client: str
) -> None:
    """The same over both ways a client reaches the proxy: its stdio, or --listen."""
    asked: dict[str, Any] = {}

    async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> Any:
        asked["sampling"] = params
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="relayed answer"), model="test"
        )

    async def elicitation(ctx: Any, params: types.ElicitRequestParams) -> Any:
        asked["elicitation"] = params
        return types.ElicitResult(action="decline")

    async def roots(ctx: Any) -> Any:
        asked["roots"] = True
        return types.ListRootsResult(roots=[types.Root(uri="file:///srv/project", name="proj")])

    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    server = npm_server(npm_servers, "mcp-server-everything", "stdio")
    callbacks = {
        "sampling_callback": sampling,
        "elicitation_callback": elicitation,
        "list_roots_callback": roots,
    }
    async with AsyncExitStack() as stack:
        if client == "stdio":
            session = await stack.enter_async_context(
                connect(proxy_params(home, server), **callbacks)
            )
        else:
            url, _ = stack.enter_context(listening(home, "proxy", "--", *server))
            session = await stack.enter_async_context(http_connect(url, **callbacks))
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"trigger-sampling-request", "trigger-elicitation-request"} <= names
        long = await session.call_tool(
            "trigger-long-running-operation",
            {"duration": 1, "steps": 4},
            progress_callback=on_progress,
        )
        sampled = await session.call_tool(
            "trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}
        )
        elicited = await session.call_tool("trigger-elicitation-request", {})
        listed = await session.call_tool("get-roots-list", {})
        structured = await session.call_tool("get-structured-content", {"location": "New York"})
        image = await session.call_tool("get-tiny-image", {})
    assert not long.is_error and len(progress) >= 3
    assert "relayed answer" in text_of(sampled)
    assert asked["sampling"].messages[0].content.text.endswith("hello")
    assert "elicitation" in asked and not elicited.is_error
    assert "file:///srv/project" in text_of(listed)
    assert structured.structured_content is not None  # validated by call_tool
    assert any(isinstance(b, types.ImageContent) for b in image.content)


async def test_crash_mid_call_gives_an_error_result_and_spillbox_tools_stay(
    npm_servers: Path, home: Path
) -> None:
    marker = f"spillbox-test-{uuid.uuid4().hex}"
    params = proxy_params(home, npm_server(npm_servers, "mcp-server-everything", "stdio"))
    params.env = {**os.environ, "SPILLBOX_TEST_MARKER": marker}
    started = anyio.Event()
    logged: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(str(params.data))

    async with connect(params, logging_callback=on_log) as session:
        result: types.CallToolResult | None = None

        async def long_call() -> None:
            nonlocal result
            result = await session.call_tool(
                "trigger-long-running-operation",
                {"duration": 30, "steps": 30},
                progress_callback=on_progress,
            )

        async with anyio.create_task_group() as group:
            group.start_soon(long_call)
            with anyio.fail_after(30):
                await started.wait()
            [pid] = processes_with(marker)
            os.kill(pid, signal.SIGKILL)
        assert result is not None and result.is_error
        assert "was killed by signal 9 (SIGKILL)" in text_of(result), text_of(result)
        with anyio.fail_after(10):
            while True:  # the proxy notices the exit, then lists spillbox's tools alone
                names = [tool.name for tool in (await session.list_tools()).tools]
                if "echo" not in names:
                    break
                await anyio.sleep(0.1)
        assert names == ["read_artifact", "list_artifacts", "search_artifacts"]
        assert any("was killed by signal 9 (SIGKILL)" in line for line in logged), logged
        listed = await session.call_tool("list_artifacts", {})
        assert not listed.is_error and json.loads(text_of(listed)) == []


async def test_disconnect_stops_the_upstream_and_closes_the_task(
    npm_servers: Path, home: Path
) -> None:
    marker = f"spillbox-test-{uuid.uuid4().hex}"
    server = npm_server(npm_servers, "mcp-server-everything", "stdio")
    params = proxy_params(home, server, "--task", "short", "--keep-after-close", "0")
    params.env = {**os.environ, "SPILLBOX_TEST_MARKER": marker}
    async with connect(params) as session:
        await session.call_tool("echo", {"message": "x" * 40_000})  # offloaded: a payload
        assert processes_with(marker)
    for _ in range(150):
        if not processes_with(marker):
            break
        await anyio.sleep(0.1)
    assert not processes_with(marker), "the upstream still runs after the client left"
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        assert "short" not in harness.tasks()  # keep-after-close 0: deleted at disconnect


async def test_progress_keeps_a_long_call_within_the_upstream_timeout(
    npm_servers: Path, home: Path
) -> None:
    """A call that runs 3 s, with progress every 0.5 s, under a 1 s upstream timeout: each
    progress notification gives the server more time."""
    server = npm_server(npm_servers, "mcp-server-everything", "stdio")
    async with connect(proxy_params(home, server, "--upstream-timeout", "1")) as session:
        result = await session.call_tool(
            "trigger-long-running-operation", {"duration": 3, "steps": 6}
        )
    assert not result.is_error, text_of(result)
    assert "completed" in text_of(result).lower()
