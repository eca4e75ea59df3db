"""spillbox as MCP: a proxy that gates every tool result of a real MCP server, and
spillbox's own tools as an MCP server.

    spillbox mcp proxy --task gh -- npx -y @modelcontextprotocol/server-github
    spillbox mcp proxy --task web --url http://127.0.0.1:3001/mcp
    spillbox mcp serve --task gh
    spillbox mcp proxy --listen 127.0.0.1:8931 -- mcp-server-git   # clients over HTTP

    from spillbox.mcp import run
    run(task, ["mcp-server-git", "--repository", "."])   # serves stdin/stdout until EOF

Modules: proxy (the server and what passes through), upstream (the real server: a
subprocess, or a URL over streamable HTTP), step (overlapping calls as one step), results
(a CallToolResult through the gate), conform (structuredContent an outputSchema accepts),
links (stored payloads as resources: resource_link, resources/read), local (spillbox's
tools as MCP tools), transport (stdio: the client's, answering malformed lines, and the
upstream's, read in linear time), spool (the upstream's long strings kept as bytes),
http (clients over streamable HTTP, a proxy per session),
ids (a request whose id the SDK would take for a notification's, refused).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from functools import partial

import anyio

from spillbox.mcp.http import (
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_TIMEOUT_SECONDS,
    Connect,
    Listen,
    OpenTask,
    parse_listen,
    serve_http,
)
from spillbox.mcp.proxy import connection, serve_stdio
from spillbox.mcp.upstream import DEFAULT_UPSTREAM_TIMEOUT_SECONDS, UPSTREAM_START_SECONDS
from spillbox.protocols import TaskHandle
from spillbox.steps import STEP_BOUND_SECONDS

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_TIMEOUT_SECONDS",
    "DEFAULT_UPSTREAM_TIMEOUT_SECONDS",
    "STEP_BOUND_SECONDS",
    "UPSTREAM_START_SECONDS",
    "Listen",
    "new_task_id",
    "parse_listen",
    "run",
    "run_http",
]


def run(
    task: TaskHandle,
    command: Sequence[str] | None = None,
    *,
    timeout: float | None = DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    bound: float = STEP_BOUND_SECONDS,
    url: str | None = None,
    start_timeout: float = UPSTREAM_START_SECONDS,
) -> None:
    """Serve MCP on stdin/stdout: in front of command's server (or the server at url, over
    streamable HTTP), or spillbox's tools alone.

    timeout: seconds an upstream request may go without its answer or progress (None: no
    limit); bound: how long a finished result waits for the other calls of its step;
    start_timeout: how long the server may take to answer its handshake."""
    anyio.run(serve_stdio, _connect(command, timeout, bound, url, start_timeout), task)


def run_http(
    listen: Listen,
    open_task: OpenTask,
    command: Sequence[str] | None = None,
    *,
    timeout: float | None = DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    bound: float = STEP_BOUND_SECONDS,
    url: str | None = None,
    session_timeout: float | None = DEFAULT_SESSION_TIMEOUT_SECONDS,
    start_timeout: float = UPSTREAM_START_SECONDS,
    task: str | None = None,
) -> None:
    """Serve MCP over streamable HTTP at listen until SIGINT or SIGTERM: each MCP session
    gets the task open_task opens (task, else a new one; closed when the session ends) and
    its own upstream; 2026-07-28 clients, which have no session, the task they name."""
    connect = _connect(command, timeout, bound, url, start_timeout)
    anyio.run(serve_http, listen, open_task, connect, session_timeout, task)


def _connect(
    command: Sequence[str] | None,
    timeout: float | None,
    bound: float,
    url: str | None,
    start_timeout: float,
) -> Connect:
    return partial(
        connection,
        command=command,
        bound=bound,
        upstream_timeout=timeout,
        url=url,
        start_timeout=start_timeout,
    )


def new_task_id() -> str:
    """A task id for a proxy started without --task: one task per client connection."""
    return f"mcp-{secrets.token_hex(4)}"
