"""spillbox mcp serve, malformed input, and tool names on a collision."""

from __future__ import annotations

import json
import select
import subprocess
from pathlib import Path

import pytest
from mcp.client.stdio import StdioServerParameters
from mcp_client import BIN, INITIALIZE, connect, git_server, proxy_params, text_of

from spillbox import Harness, ToolResult, parse_notice
from spillbox.mcp import ids
from spillbox.tools import Toolset

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]


async def test_serve_reads_what_a_proxy_of_the_same_task_stored(git_repo: Path, home: Path) -> None:
    args = {"repo_path": str(git_repo), "max_count": 1000}
    async with connect(proxy_params(home, git_server(git_repo), "--task", "shared")) as proxy:
        notice = parse_notice(text_of(await proxy.call_tool("git_log", args)))
        assert notice is not None
        serve = StdioServerParameters(
            command=str(BIN / "spillbox"),
            args=["mcp", "serve", "--home", str(home), "--sandbox", "none", "--task", "shared"],
        )
        async with connect(serve) as server:
            names = [tool.name for tool in (await server.list_tools()).tools]
            listed = json.loads(text_of(await server.call_tool("list_artifacts", {})))
            page = await server.call_tool("read_artifact", {"path": notice["path"]})
    assert names == ["read_artifact", "list_artifacts", "search_artifacts"]
    assert [row["artifact_id"] for row in listed] == [notice["call_id"]]
    assert json.loads(text_of(page))["text"].startswith("Commit history:")


BAD_IDS = ({"a": 1}, [1], 1.5, 2.0, True, None)
"""Ids JSON-RPC does not allow, which the SDK takes for a notification's (no answer)."""


def test_malformed_lines_get_json_rpc_errors(git_repo: Path, home: Path) -> None:
    unknown = {"jsonrpc": "2.0", "id": 2, "method": "no/such/method"}
    bad_ids = [json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/list"}) for i in BAD_IDS]
    # An id key in a tool's own arguments is the tool's business, not the request's.
    nested = {
        "jsonrpc": "2.0",
        "id": "n",
        "method": "tools/call",
        "params": {"name": "git_status", "arguments": {"repo_path": str(git_repo), "id": {}}},
    }
    lines = [
        "this is not json",
        '{"hello": "world"}',
        json.dumps(INITIALIZE),
        json.dumps(unknown),
        *bad_ids,
        '{"jsonrpc": "2.0", "id" : [], "method": "ping"}',
        json.dumps(nested),
    ]
    params = proxy_params(home, git_server(git_repo))
    with subprocess.Popen(
        [params.command, *params.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proxy:
        assert proxy.stdin is not None and proxy.stdout is not None
        replies = []
        for line in lines:  # one at a time: the reply, then the next line
            proxy.stdin.write(line + "\n")
            proxy.stdin.flush()
            # A line left unanswered fails here, not by hanging the run.
            assert select.select([proxy.stdout], [], [], 30)[0], f"no answer to {line[:80]}"
            replies.append(json.loads(proxy.stdout.readline()))
        proxy.stdin.close()
        assert proxy.wait(timeout=30) == 0
    assert replies[0] == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "Parse error: not JSON"},
    }
    assert replies[1]["id"] is None and replies[1]["error"]["code"] == -32600
    assert replies[2]["id"] == 1 and replies[2]["result"]["serverInfo"]["name"] == "mcp-git"
    assert replies[3]["id"] == 2 and replies[3]["error"]["code"] == -32601
    refused = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": ids.REFUSAL},
    }
    assert replies[4:-1] == [refused] * (len(BAD_IDS) + 1)
    assert replies[-1]["id"] == "n" and "result" in replies[-1]


def test_hints_name_prefixed_tools_on_a_collision(home: Path) -> None:
    """An upstream tool called read_artifact: ours is spillbox_read_artifact, and notices'
    hints call it by that name."""
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness, harness.task("t") as task:
        toolset = Toolset(task, taken={"read_artifact", "git_log"})
        assert toolset.names == ("spillbox_read_artifact", "list_artifacts", "search_artifacts")
        task.register_tools(toolset.names)
        [admitted] = task.admit([ToolResult("c1", "dump", "line\n" * 20_000)])
        notice = parse_notice(admitted.text)
        assert notice is not None
        tool, _, args = notice["hint"].partition(" ")
        assert tool == "spillbox_read_artifact"
        output = toolset.call(tool, json.loads(args))
        assert not output.is_error and json.loads(output.text)["has_more"]
        assert toolset.call("read_artifact", json.loads(args)).is_error  # not ours here
