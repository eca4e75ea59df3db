"""Attacks on `spillbox mcp proxy --listen` by a client that opens sessions without end
(issue 21, rough edge): each session starts an upstream process and opens a task, so at
most --max-sessions (default DEFAULT_MAX_SESSIONS) are open at once, and an initialize past
that gets a clear 503 and starts nothing."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from mcp_client import BIN, INITIALIZE, http_connect, listening, processes_with, text_of, toy_server
from test_proxy_listen import post, task_states, wait_for

from spillbox.mcp import DEFAULT_MAX_SESSIONS

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]


def innermost(group: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds, at any depth."""
    if not isinstance(group, BaseExceptionGroup):
        return [group]
    return [inner for e in group.exceptions for inner in innermost(e)]


def test_initializes_sent_at_once_open_no_more_sessions_than_the_cap(home: Path) -> None:
    marker = "listen-cap-burst"
    args = ("proxy", "--max-sessions", "2", "--", *toy_server())
    with listening(home, *args, marker=marker) as (url, _):
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: post(url, INITIALIZE), range(8)))
        upstreams = processes_with(marker)
        states = task_states(home)
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200, 200, *[503] * 6], statuses
    assert len(upstreams) == 2, upstreams
    assert len(states) == 2, states  # a refused initialize opened no task
    refused = json.loads(next(body for status, _, body in answers if status == 503))
    assert refused["id"] is None
    message = refused["error"]["message"]
    assert "2 MCP sessions are open" in message and "--max-sessions" in message


async def test_a_session_past_the_cap_is_refused_until_one_ends(home: Path) -> None:
    marker = "listen-cap"
    args = ("proxy", "--max-sessions", "2", "--", *toy_server())
    with listening(home, *args, marker=marker) as (url, _):
        async with http_connect(url) as one:
            async with http_connect(url) as two:
                status, _, body = await anyio.to_thread.run_sync(post, url, INITIALIZE)
                assert status == 503 and "--max-sessions" in body, body
                with pytest.raises(BaseExceptionGroup) as refused:  # the SDK client's
                    async with http_connect(url):
                        pass
                [error] = innermost(refused.value)
                assert isinstance(error, MCPError), error
                assert "2 MCP sessions are open" in error.message
                assert len(processes_with(marker)) == 2
                answer = await two.call_tool("echo", {"text": "two"})
            await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: len(processes_with(marker)) == 1)
            )
            async with http_connect(url) as three:  # the ended session's place is free
                answers = [await s.call_tool("echo", {"text": "up"}) for s in (one, three)]
    assert text_of(answer) == "two"
    assert [text_of(a) for a in answers] == ["up", "up"]


def test_the_cap_has_a_stated_default_and_must_be_at_least_one(home: Path) -> None:
    assert DEFAULT_MAX_SESSIONS == 8
    command = [str(BIN / "spillbox"), "mcp", "proxy", "--home", str(home), "--sandbox", "none"]
    command += ["--listen", "127.0.0.1:0", "--max-sessions", "0", "--", *toy_server()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--max-sessions 0: give 1 or more" in done.stderr, done.stderr
