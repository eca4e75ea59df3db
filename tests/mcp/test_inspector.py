"""The MCP Inspector's command line (npm @modelcontextprotocol/inspector --cli), a client
of the TypeScript SDK's, through the proxy in front of server-filesystem, over the proxy's
stdio and over streamable HTTP (--listen): each command is one connection (one session),
so the task is named for the second to read what the first stored."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp_client import BIN, listening, npm_server

from spillbox import parse_notice

pytest_plugins = ["mcp_fixtures"]


def inspector(npm_servers: Path, target: list[str], *args: str) -> Any:
    """One Inspector CLI command, connecting to target (a command, or a URL)."""
    done = subprocess.run(
        [str(npm_servers / "mcp-inspector"), "--cli", *target, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


@contextmanager
def proxy_target(home: Path, server: list[str], client: str) -> Iterator[list[str]]:
    """`spillbox mcp proxy --task inspected` in front of server: a command the Inspector
    starts (stdio), or a proxy listening for it (http)."""
    if client == "stdio":
        proxy = [str(BIN / "spillbox"), "mcp", "proxy", "--home", str(home), "--sandbox", "none"]
        yield [*proxy, "--task", "inspected", "--", *server]
    else:
        with listening(home, "proxy", "--task", "inspected", "--", *server) as (url, _):
            yield [url]


@pytest.mark.parametrize("client", ["stdio", "http"])
def test_inspector_lists_calls_and_reads_back_through_the_proxy(
    npm_servers: Path, tmp_path: Path, home: Path, client: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    big = data / "users.ndjson"
    lines = [json.dumps({"id": n, "name": f"user {n}"}) for n in range(20_000)]
    big.write_text("\n".join(lines) + "\n")
    server = npm_server(npm_servers, "mcp-server-filesystem", str(data))
    with proxy_target(home, server, client) as target:
        check_inspector(npm_servers, target, big)


def check_inspector(npm_servers: Path, target: list[str], big: Path) -> None:
    listed = inspector(npm_servers, target, "--method", "tools/list")
    names = {tool["name"] for tool in listed["tools"]}
    assert {"read_text_file", "directory_tree", "read_artifact", "list_artifacts"} <= names

    # The Inspector's SDK client validates structuredContent against the outputSchema.
    call = ["--method", "tools/call", "--tool-name", "read_text_file"]
    result = inspector(npm_servers, target, *call, "--tool-arg", f"path={big}")
    block, link = result["content"]
    notice = parse_notice(block["text"])
    assert notice is not None, block["text"]
    assert result["structuredContent"] == {"content": block["text"]}
    assert (
        link["type"] == "resource_link" and link["uri"] == "spillbox://inspected/read_text_file_1"
    )
    assert Path(notice["path"]).read_text() == big.read_text()

    tool, _, hint = notice["hint"].splitlines()[-1].partition(" ")
    assert tool == "read_artifact"
    arguments = [f"{key}={value}" for key, value in json.loads(hint).items()]
    read = ["--method", "tools/call", "--tool-name", tool, "--tool-arg", *arguments]
    page = json.loads(inspector(npm_servers, target, *read)["content"][0]["text"])
    assert page["items"][0] == {"id": 0, "name": "user 0"} and page["has_more"] is True

    read = ["--method", "resources/read", "--uri", link["uri"]]
    [contents] = inspector(npm_servers, target, *read)["contents"]
    first = json.loads(contents["text"])
    # The same records from the start; the page's size depends on its envelope (a resource
    # page carries next_uri beside the cursor), so it may hold a record more or less.
    records = [json.loads(line) for line in big.read_text().splitlines()]
    assert first["items"] == records[: len(first["items"])] and len(first["items"]) > 1
    assert first["next_uri"].startswith(link["uri"] + "?")
