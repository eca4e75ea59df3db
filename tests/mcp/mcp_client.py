"""The MCP tests' client side: the official SDK's ClientSession over the stdio of
`spillbox mcp proxy`, and where the real servers are."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / ".cache" / "mcp-servers"
NPM_PACKAGES = (
    "@modelcontextprotocol/server-everything",
    "@modelcontextprotocol/server-filesystem",
    "@modelcontextprotocol/inspector",
)
COMMITS = 3000
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
"""An initialize request as a raw client sends it."""


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def proxy_params(
    home: Path, command: Sequence[str], *flags: str, sandbox: str = "none"
) -> StdioServerParameters:
    args = ["mcp", "proxy", "--home", str(home), "--sandbox", sandbox, *flags, "--", *command]
    return StdioServerParameters(command=str(BIN / "spillbox"), args=args)


@asynccontextmanager
async def connect(params: StdioServerParameters, **callbacks: Any) -> AsyncIterator[ClientSession]:
    """An initialized SDK ClientSession over the stdio of the process params start."""
    async with stdio_client(params) as (read, write), ClientSession(read, write, **callbacks) as s:
        await s.initialize()
        yield s


@contextmanager
def listening(
    home: Path, *args: str, marker: str = ""
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`spillbox mcp ARGS --listen 127.0.0.1:0` running; its URL (read from its stderr,
    which a thread goes on reading so that the server never blocks on it)."""
    command = [str(BIN / "spillbox"), "mcp", *args[:1], "--home", str(home), "--sandbox", "none"]
    command += ["--listen", "127.0.0.1:0", *args[1:]]
    env = {**os.environ, "SPILLBOX_TEST_MARKER": marker}
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env) as server:
        assert server.stderr is not None
        stderr = server.stderr
        line = stderr.readline()
        drain = threading.Thread(target=stderr.read, daemon=True)
        drain.start()
        try:
            found = re.search(r"http://\S+/mcp", line)
            assert found, f"no URL in {line!r}"
            yield found.group(0), server
        finally:
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                server.wait(timeout=30)
            drain.join(timeout=10)


@asynccontextmanager
async def http_connect(url: str, **callbacks: Any) -> AsyncIterator[ClientSession]:
    """An initialized SDK ClientSession over streamable HTTP, a session of its own."""
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write, **callbacks) as s,
    ):
        await s.initialize()
        yield s


async def appears(path: Path) -> None:
    """Wait until path exists (at most 10 s)."""
    for _ in range(200):
        if await anyio.Path(path).exists():
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"{path} did not appear in 10 s")


def git_server(repo: Path) -> list[str]:
    return [str(BIN / "mcp-server-git"), "--repository", str(repo)]


def toy_server(*args: str) -> list[str]:
    """tests/mcp/toy_server.py, a small server of the SDK's, as an upstream command."""
    return [sys.executable, str(Path(__file__).with_name("toy_server.py")), *args]


def npm_server(bin_dir: Path, name: str, *args: str) -> list[str]:
    return [str(bin_dir / name), *args]


def processes_with(marker: str) -> list[int]:
    """Pids of the processes whose environment holds marker (the proxy passes its own
    environment to the upstream server), other than spillbox itself: a process running the
    checkout's `spillbox` command (not any command line holding the word, which is the
    checkout's own path where `git clone` named it spillbox)."""
    ours = str(BIN / "spillbox").encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ and ours not in cmdline.split(b"\0"):
            pids.append(int(proc.name))
    return pids


def proxy_pid() -> int:
    """The `spillbox mcp proxy` among this process's children (its upstream is a
    grandchild)."""
    for thread in Path("/proc/self/task").iterdir():
        for child in (thread / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"mcp" in cmdline and b"proxy" in cmdline:
                return int(child)
    raise AssertionError("no spillbox mcp proxy among this process's children")


def memory_kb(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (the peak) of a process, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise AssertionError(f"no {field} in /proc/{pid}/status")
