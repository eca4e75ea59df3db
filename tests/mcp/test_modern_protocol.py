"""Both protocol eras through the proxy (issue 22): the official SDK client in each of its
modes (auto, the legacy handshake, 2026-07-28) over stdio and streamable HTTP, the
failures a new user meets first, and how a proxy's ending closes its task."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_client import (
    BIN,
    INITIALIZE,
    git_server,
    listening,
    npm_server,
    processes_with,
    proxy_params,
    proxy_pid,
    text_of,
    toy_server,
)
from test_inspector import inspector

from mcp import Client
from spillbox import Harness, parse_notice

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]

MODES = ["auto", "legacy", "2026-07-28"]
SPILLBOX_TOOLS = {"sandbox_exec", "read_artifact", "list_artifacts"}


def innermost(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


@pytest.mark.parametrize("mode", MODES)
async def test_each_client_mode_gets_the_git_servers_tools_and_gated_results(
    mode: str, git_repo: Path, home: Path
) -> None:
    async with Client(proxy_params(home, git_server(git_repo)), mode=mode) as client:
        expected = "2025-11-25" if mode == "legacy" else "2026-07-28"
        assert client.protocol_version == expected
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert {"git_log", "git_status"} <= names
        assert names & SPILLBOX_TOOLS
        small = await client.call_tool("git_status", {"repo_path": str(git_repo)})
        large = await client.call_tool("git_log", {"repo_path": str(git_repo), "max_count": 3000})
    assert not small.is_error and "On branch main" in text_of(small)
    notice = parse_notice(text_of(large))
    assert notice is not None and notice["call_id"].startswith("git_log_")


@pytest.mark.parametrize("mode", ["auto", "2026-07-28"])
async def test_a_2026_client_behind_a_2026_upstream_gets_results_and_links(
    mode: str, home: Path
) -> None:
    """The toy server (the SDK's) speaks 2026-07-28 too: both sides stateless."""
    async with Client(proxy_params(home, toy_server(), "--task", "both"), mode=mode) as client:
        echoed = await client.call_tool("echo", {"text": "hello"})
        large = await client.call_tool("blob", {"size": 100_000})
        [link] = [b for b in large.content if isinstance(b, types.ResourceLink)]
        [contents] = (await client.read_resource(str(link.uri))).contents
    assert text_of(echoed) == "hello"
    assert str(link.uri).startswith("spillbox://both/blob_")
    assert isinstance(contents, types.TextResourceContents) and json.loads(contents.text)


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["spillbox-no-such-server"], "could not be started: No such file or directory"),
        (
            [sys.executable, "-c", "import sys; print('bad token', file=sys.stderr); sys.exit(3)"],
            "exited with status 3 before it answered; its stderr ended with: bad token",
        ),
        (
            [sys.executable, "-c", "import time; time.sleep(60)"],
            "did not answer initialize within 1 s",
        ),
    ],
    ids=["missing", "exits", "silent"],
)
@pytest.mark.parametrize("mode", MODES)
async def test_an_upstream_that_cannot_start_fails_the_first_request_with_why(
    mode: str, command: list[str], says: str, home: Path, tmp_path: Path
) -> None:
    errors = tmp_path / "stderr"
    params = proxy_params(home, command, "--upstream-start-timeout", "1")
    with errors.open("w") as log, pytest.raises(BaseException) as raised:  # noqa: PT011
        async with Client(stdio_client(params, errlog=log), mode=mode) as client:
            await client.list_tools()
    error = innermost(raised.value)  # the SDK client wraps it in groups of its own
    assert isinstance(error, MCPError) and says in error.error.message, error
    lines = [line for line in errors.read_text().splitlines() if "spillbox:" in line]
    assert lines and all("ExceptionGroup" not in line for line in lines), lines


async def test_a_call_after_the_upstream_exited_says_before_the_call(home: Path) -> None:
    async with Client(proxy_params(home, toy_server()), mode="legacy") as client:
        during = await client.call_tool("exit", {"status": 3})
        with anyio.fail_after(10):
            while True:
                after = await client.call_tool("echo", {"text": "x"})
                if "before this call" in text_of(after):
                    break
                await anyio.sleep(0.1)
    assert "exited with status 3 during this call" in text_of(during), text_of(during)
    assert after.is_error and "exited with status 3 before this call" in text_of(after)


def test_the_upstream_command_is_accepted_without_a_double_dash(git_repo: Path, home: Path) -> None:
    args = ["mcp", "proxy", "--home", str(home), "--sandbox", "none", *git_server(git_repo)]
    params = StdioServerParameters(command=str(BIN / "spillbox"), args=args)

    async def main() -> set[str]:
        async with Client(params, mode="auto") as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    assert "git_log" in anyio.run(main)


async def test_sigterm_closes_the_task_and_stops_the_upstream(home: Path) -> None:
    marker = f"spillbox-test-{uuid.uuid4().hex}"
    params = proxy_params(home, toy_server(), "--task", "ends", "--keep-after-close", "0")
    params.env = {**os.environ, "SPILLBOX_TEST_MARKER": marker}
    async with Client(params, mode="auto") as client:
        await client.call_tool("wide", {"rows": 4000})  # offloaded: the task has a payload
        assert processes_with(marker)
        os.kill(proxy_pid(), signal.SIGTERM)
    for _ in range(200):
        if not processes_with(marker):
            break
        await anyio.sleep(0.1)
    assert not processes_with(marker), "the upstream still runs after SIGTERM"
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        assert "ends" not in harness.tasks()  # closed at SIGTERM, its retention applied


@pytest.mark.parametrize("mode", ["auto", "2026-07-28"])
async def test_a_2026_client_over_http_reads_its_payload_in_a_later_request(
    mode: str, git_repo: Path, home: Path
) -> None:
    with listening(home, "proxy", "--", *git_server(git_repo)) as (url, _server):
        async with Client(url, mode=mode) as client:
            assert client.protocol_version == "2026-07-28"
            names = {tool.name for tool in (await client.list_tools()).tools}
            large = await client.call_tool(
                "git_log", {"repo_path": str(git_repo), "max_count": 3000}
            )
            notice = parse_notice(text_of(large))
            assert notice is not None
            # A later request (another POST, no session) reads the same task's payload.
            read = await client.call_tool("read_artifact", {"path": notice["path"]})
    assert "git_log" in names
    assert not read.is_error, text_of(read)
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        assert any(task.startswith("mcp-") for task in harness.tasks())


async def test_an_image_repeated_in_structured_content_passes_untouched(
    npm_servers: Path, home: Path, tmp_path: Path
) -> None:
    """server-filesystem's read_media_file puts the image's base64 in structuredContent as
    well: a 9 KB PNG still comes back as the server sent it, not offloaded."""
    root = tmp_path / "media"
    root.mkdir()
    (root / "chart.png").write_bytes(os.urandom(9000))
    server = npm_server(npm_servers, "mcp-server-filesystem", str(root))
    async with Client(proxy_params(home, server), mode="auto") as client:
        result = await client.call_tool("read_media_file", {"path": str(root / "chart.png")})
        stored = await client.call_tool("list_artifacts", {})
    [image] = [b for b in result.content if isinstance(b, types.ImageContent)]
    assert len(base64.b64decode(image.data)) == 9000
    assert parse_notice(text_of(result)) is None
    assert image.data in json.dumps(result.structured_content)
    assert json.loads(text_of(stored)) == []


def raw_exchange(params: StdioServerParameters, messages: list[dict[str, object]]) -> list[Any]:
    """Each message written to the proxy's stdin, and the answer of each request read."""
    with subprocess.Popen(
        [params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proxy:
        assert proxy.stdin is not None and proxy.stdout is not None
        replies = []
        for message in messages:
            proxy.stdin.write(json.dumps(message) + "\n")
            proxy.stdin.flush()
            if "id" in message:
                replies.append(json.loads(proxy.stdout.readline()))
        proxy.stdin.close()
        assert proxy.wait(timeout=30) == 0
    return replies


def test_a_small_result_reaches_the_client_exactly_as_the_server_sent_it(home: Path) -> None:
    sent = {"content": [{"type": "text", "text": "small"}]}  # no isError, no structuredContent
    call = {"name": "result", "arguments": {"result": sent}}
    replies = raw_exchange(
        proxy_params(home, toy_server()),
        [
            INITIALIZE,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call},
        ],
    )
    assert replies[1] == {"jsonrpc": "2.0", "id": 2, "result": sent}


def test_the_inspector_cli_runs_a_server_command_with_options_through_the_proxy(
    npm_servers: Path, git_repo: Path, home: Path
) -> None:
    """The Inspector drops the -- it is given, so spillbox gets the server's options
    (-m, --repository) right after its own."""
    proxy = [str(BIN / "spillbox"), "mcp", "proxy", "--home", str(home), "--sandbox", "none"]
    server = [sys.executable, "-m", "mcp_server_git", "--repository", str(git_repo)]
    listed = inspector(npm_servers, [*proxy, "--", *server], "--method", "tools/list")
    assert {"git_log", "read_artifact"} <= {tool["name"] for tool in listed["tools"]}


def test_malformed_arguments_get_an_error_that_names_the_field(home: Path) -> None:
    calls = [{"name": "echo", "arguments": "not an object"}, {"arguments": {}}]
    replies = raw_exchange(
        proxy_params(home, toy_server()),
        [
            INITIALIZE,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            *(
                {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}
                for n, params in enumerate(calls, 2)
            ),
        ],
    )
    errors = [reply["error"] for reply in replies[1:]]
    assert [e["code"] for e in errors] == [-32602, -32602]
    assert [[f["field"] for f in e["data"]] for e in errors] == [
        ["params.arguments"],
        ["params.name"],
    ]
    assert "params.arguments" in errors[0]["message"]


async def test_2026_clients_over_http_are_kept_apart_or_share_the_task_they_name(
    home: Path,
) -> None:
    """Without a name, each client's task is its clientInfo name's; a Spillbox-Task header
    names one. Each task's payload is its own."""
    with listening(home, "proxy", "--", *toy_server()) as (url, _server):
        stored: dict[str, str] = {}
        for label, headers, info in [
            ("one", {}, "client-one"),
            ("two", {}, "client-two"),
            ("named", {"Spillbox-Task": "named"}, "client-one"),
        ]:
            async with (
                httpx2.AsyncClient(headers=headers) as http,
                Client(
                    streamable_http_client(url, http_client=http),
                    mode="2026-07-28",
                    client_info=types.Implementation(name=info, version="1"),
                ) as client,
            ):
                result = await client.call_tool("blob", {"size": 100_000})
                notice = parse_notice(text_of(result))
                assert notice is not None, text_of(result)[:200]
                stored[label] = notice["path"]
    tasks = {label: Path(path).parts[-3] for label, path in stored.items()}
    assert tasks == {"one": "mcp-client-one", "two": "mcp-client-two", "named": "named"}
