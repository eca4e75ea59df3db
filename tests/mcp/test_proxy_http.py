"""An upstream that speaks streamable HTTP (`spillbox mcp proxy --url`): server-everything
(npm) in its streamableHttp mode, and a server on the official SDK's own stateful app."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from mcp.client.stdio import StdioServerParameters
from mcp_client import BIN, connect, text_of, toy_server

from spillbox import parse_notice

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]


@contextmanager
def serving(command: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    """command (given a free local port as PORT in its environment and as {port} in its
    arguments) serving MCP over HTTP; its /mcp endpoint, once it accepts connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [arg.format(port=port) for arg in command],
        env={**os.environ, **(env or {}), "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def everything_url(npm_servers: Path) -> Iterator[str]:
    """server-everything listening on a free local port; its /mcp endpoint."""
    with serving([str(npm_servers / "mcp-server-everything"), "streamableHttp"]) as url:
        yield url


async def test_a_streamable_http_upstream_is_gated_and_relays_progress(
    everything_url: str, home: Path
) -> None:
    args = ["mcp", "proxy", "--home", str(home), "--sandbox", "none", "--url", everything_url]
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    big = "y" * 3_000_000  # over the SDK's default 1 MB cap on one SSE event
    async with connect(StdioServerParameters(command=str(BIN / "spillbox"), args=args)) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        small = await session.call_tool("echo", {"message": "hello"})
        large = await session.call_tool("echo", {"message": big})
        long = await session.call_tool(
            "trigger-long-running-operation",
            {"duration": 1, "steps": 4},
            progress_callback=on_progress,
        )
    assert {"echo", "read_artifact", "list_artifacts"} <= names
    assert text_of(small) == "Echo: hello"
    notice = parse_notice(text_of(large))
    assert notice is not None, text_of(large)[:300]
    assert await anyio.Path(notice["path"]).read_text() == f"Echo: {big}"
    assert not long.is_error and len(progress) >= 3


async def test_an_upstream_on_the_sdks_own_http_app_is_gated(home: Path) -> None:
    """An upstream on the official SDK's stateful streamable HTTP app, which answers
    server/discover (server-everything does not): tools listed and called through the
    proxy, a large result stored whole."""
    with serving(toy_server("--http", "{port}")) as url:
        args = ["mcp", "proxy", "--home", str(home), "--sandbox", "none", "--url", url]
        params = StdioServerParameters(command=str(BIN / "spillbox"), args=args)
        async with connect(params) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            small = await session.call_tool("echo", {"text": "hello"})
            large = await session.call_tool("blob", {"size": 200_000})
    assert {"echo", "blob", "read_artifact"} <= names
    assert text_of(small) == "hello"
    notice = parse_notice(text_of(large))
    assert notice is not None, text_of(large)[:300]
    stored = await anyio.Path(notice["path"]).read_text()
    assert len(stored) == 200_000 and stored.startswith("0123456789abcdef")
