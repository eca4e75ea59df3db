"""The MCP tests' client side: the official SDK's ClientSession over the stdio of
`spillbox mcp proxy`, and where the real servers are."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
SERVERS = REPO / ".cache" / "mcp-servers"
NPM_PACKAGES = (
    "@modelcontextprotocol/server-everything",
    "@modelcontextprotocol/server-filesystem",
    "@modelcontextprotocol/inspector",
)
COMMITS = 3000


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


def git_server(repo: Path) -> list[str]:
    return [str(BIN / "mcp-server-git"), "--repository", str(repo)]


def toy_server(*args: str) -> list[str]:
    """tests/mcp/toy_server.py, a small server of the SDK's, as an upstream command."""
    return [sys.executable, str(Path(__file__).with_name("toy_server.py")), *args]


def npm_server(bin_dir: Path, name: str, *args: str) -> list[str]:
    return [str(bin_dir / name), *args]


def processes_with(marker: str) -> list[int]:
    """Pids of the processes whose environment holds marker (the proxy passes its own
    environment to the upstream server), other than spillbox itself."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes()
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ and b"spillbox" not in cmdline:
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
