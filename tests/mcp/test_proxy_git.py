"""mcp-server-git (PyPI) behind the proxy, over a repository of 3,000 commits."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp.client.stdio import StdioServerParameters
from mcp_client import BIN, appears, connect, git_server, proxy_params

from spillbox import parse_notice

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]


def text_of(result: types.CallToolResult) -> str:
    [block] = [b for b in result.content if isinstance(b, types.TextContent)]
    return block.text


async def direct_call(command: list[str], tool: str, args: dict[str, object]) -> str:
    params = StdioServerParameters(command=command[0], args=command[1:])
    async with connect(params) as session:
        return text_of(await session.call_tool(tool, args))


async def test_git_log_is_offloaded_byte_for_byte(git_repo: Path, home: Path) -> None:
    args = {"repo_path": str(git_repo), "max_count": 3000}
    direct = await direct_call(git_server(git_repo), "git_log", args)
    async with connect(proxy_params(home, git_server(git_repo), "--task", "g")) as session:
        result = await session.call_tool("git_log", args)
    assert not result.is_error
    notice = parse_notice(text_of(result))
    assert notice is not None, text_of(result)
    assert notice["reason"].startswith("per_call")
    stored = await anyio.Path(notice["path"]).read_bytes()  # sandbox "none": a host path
    assert stored == direct.encode()
    assert notice["sha256"] == hashlib.sha256(direct.encode()).hexdigest()
    assert len(direct) > 300_000


async def test_small_results_pass_unchanged(git_repo: Path, home: Path) -> None:
    args = {"repo_path": str(git_repo), "max_count": 3}
    direct = await direct_call(git_server(git_repo), "git_log", args)
    async with connect(proxy_params(home, git_server(git_repo))) as session:
        assert text_of(await session.call_tool("git_log", args)) == direct
        names = [tool.name for tool in (await session.list_tools()).tools]
    assert {"git_log", "git_show", "read_artifact", "list_artifacts"} <= set(names)
    assert "sandbox_exec" not in names  # sandbox "none" runs no code mode


async def test_every_hint_runs_through_the_proxy(git_repo: Path, home: Path) -> None:
    async with connect(proxy_params(home, git_server(git_repo))) as session:
        result = await session.call_tool("git_log", {"repo_path": str(git_repo), "max_count": 500})
        notice = parse_notice(text_of(result))
        assert notice is not None
        hints = notice["hint"].splitlines()
        assert hints
        for hint in hints:
            tool, _, args = hint.partition(" ")
            output = await session.call_tool(tool, json.loads(args))
            assert not output.is_error, text_of(output)
            page = json.loads(text_of(output))
            assert page["text"].startswith("Commit history:")
            assert page["has_more"] is True


GIT_HELD = """#!/bin/sh
# git, but while the directory $HOLD exists a rev-list (what git_log runs) says it has
# come, then waits there until the test leaves the file "release" (at most 30 s).
for arg in "$@"; do
    if [ "$arg" = rev-list ] && [ -d "$HOLD" ]; then
        : > "$HOLD/came"
        tries=0
        while [ ! -e "$HOLD/release" ] && [ "$tries" -lt 1500 ]; do
            sleep 0.02
            tries=$((tries + 1))
        done
        break
    fi
done
exec git "$@"
"""


async def test_concurrent_calls_are_one_step(git_repo: Path, home: Path, tmp_path: Path) -> None:
    """Two results each under the per-call limit, together over the aggregate limit: the
    proxy holds the first until the second is done, and offloads one of them.

    MCP has no batches: the proxy takes calls whose lifetimes overlap as one step. The
    server runs one git tool at a time, so the first git_log is held in its git until the
    client has sent the second and the proxy has had a second to read it: the calls
    overlap however loaded the machine, where a quick first call could end before the
    second came."""
    git = tmp_path / "git"
    git.write_text(GIT_HELD)
    git.chmod(0o755)
    hold = tmp_path / "hold"
    params = proxy_params(home, git_server(git_repo))
    environment = {"GIT_PYTHON_GIT_EXECUTABLE": str(git), "HOLD": str(hold)}
    params = params.model_copy(update={"env": {**os.environ, **environment}})
    args = {"repo_path": str(git_repo), "max_count": 75}
    texts: dict[int, str] = {}
    async with connect(params) as session:
        alone = text_of(await session.call_tool("git_log", args))
        assert parse_notice(alone) is None  # one alone stays inline
        hold.mkdir()

        async def call(n: int) -> None:
            texts[n] = text_of(await session.call_tool("git_log", args))

        async with anyio.create_task_group() as group:
            group.start_soon(call, 0)
            await appears(hold / "came")  # the first is in the server's git
            group.start_soon(call, 1)
            await anyio.sleep(1)
            (hold / "release").touch()
    notices = [parse_notice(text) for text in texts.values()]
    offloaded = [n for n in notices if n is not None]
    assert len(offloaded) == 1, texts
    assert offloaded[0]["reason"].startswith("aggregate")
    assert alone in texts.values()


async def test_calls_that_do_not_overlap_are_separate_steps(git_repo: Path, home: Path) -> None:
    args = {"repo_path": str(git_repo), "max_count": 75}
    async with connect(proxy_params(home, git_server(git_repo))) as session:
        for _ in range(2):
            assert parse_notice(text_of(await session.call_tool("git_log", args))) is None


def test_spillbox_bin_is_installed() -> None:
    assert (BIN / "spillbox").exists() and (BIN / "mcp-server-git").exists()


@pytest.mark.docker
async def test_every_hint_runs_in_the_docker_sandbox(git_repo: Path, docker_home: Path) -> None:
    """With code mode, the notice's first hint is a sandbox_exec call: run as sent, through
    the proxy, it succeeds in the task's sandbox; so does read_artifact."""
    args = {"repo_path": str(git_repo), "max_count": 3000}
    params = proxy_params(docker_home, git_server(git_repo), "--task", "d", sandbox="docker")
    async with connect(params) as session:
        notice = parse_notice(text_of(await session.call_tool("git_log", args)))
        assert notice is not None
        assert notice["path"] == "/sandbox/offload/git_log_1.txt"
        hints = notice["hint"].splitlines()
        assert [hint.split(" ")[0] for hint in hints] == ["sandbox_exec", "read_artifact"]
        for hint in hints:
            tool, _, hint_args = hint.partition(" ")
            output = await session.call_tool(tool, json.loads(hint_args))
            assert not output.is_error, text_of(output)
        count = await session.call_tool(
            "sandbox_exec",
            {
                "lang": "sh",
                "code": f"grep -c '^Commit: ' {notice['path']}",
                "timeout": None,
                "artifact": None,
            },
        )
    assert json.loads(text_of(count))["output"].strip() == "3000"
