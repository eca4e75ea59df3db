"""The MCP Inspector's command line in 2026-07-28 mode (`--protocol-era modern`, Inspector
2.12 on Node 22) over streamable HTTP, through the proxy (issue 22 item 5): each command is
one stateless exchange; its task is named after the Inspector's clientInfo, so a later
command reads what an earlier one stored."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from mcp_client import listening, toy_server

from spillbox import parse_notice

pytest_plugins = ["mcp_fixtures"]


def modern(command: list[str], url: str, *args: str) -> Any:
    done = subprocess.run(
        [*command, "--cli", url, "--protocol-era", "modern", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def test_the_2026_inspector_lists_calls_and_reads_back_over_http(
    inspector_2026: list[str], home: Path
) -> None:
    # A start timeout with room for a loaded machine (8 s by default).
    args = ("proxy", "--upstream-start-timeout", "60", "--", *toy_server())
    with listening(home, *args) as (url, _server):
        listed = modern(inspector_2026, url, "--method", "tools/list")
        names = {tool["name"] for tool in listed["tools"]}
        assert {"echo", "blob", "read_artifact", "list_artifacts"} <= names
        call = ["--method", "tools/call", "--tool-name", "blob", "--tool-arg", "size=100000"]
        result = modern(inspector_2026, url, *call)
        block, link = result["content"]
        notice = parse_notice(block["text"])
        assert notice is not None, block["text"]
        task = link["uri"].removeprefix("spillbox://").split("/")[0]
        # A stateless client's task (its clientInfo name's), not a session's mcp-<8 hex>.
        assert task.startswith("mcp-") and not re.fullmatch(r"mcp-[0-9a-f]{8}", task), task
        read = ["--method", "resources/read", "--uri", link["uri"]]
        [contents] = modern(inspector_2026, url, *read)["contents"]
    page = json.loads(contents["text"])
    assert page["text"].startswith("0123456789abcdef") and page["has_more"] is True
