"""Real MCP servers for the proxy's tests, installed from their registries: npm's
server-everything and server-filesystem, and the MCP Inspector as a second client (into
<repo>/.cache/mcp-servers, once), and PyPI's mcp-server-git (a dev dependency). Test
modules load these fixtures with `pytest_plugins = ["mcp_fixtures"]` (a second conftest.py
would shadow the suite's own).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest
from mcp_client import COMMITS, NPM_PACKAGES, SERVERS


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def npm_servers() -> Path:
    """The npm servers' bin folder, installed from the registry on first use."""
    bin_dir = SERVERS / "node_modules" / ".bin"
    names = ("mcp-server-everything", "mcp-server-filesystem", "mcp-inspector")
    wanted = [bin_dir / name for name in names]
    SERVERS.mkdir(parents=True, exist_ok=True)
    # Test workers start together: one installs, the others wait and find it installed.
    with open(SERVERS / "install.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not all(path.exists() for path in wanted):
            npm = shutil.which("npm")
            if npm is None:
                pytest.fail("npm is needed to install the MCP test servers (Node 20)")
            subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(SERVERS)]
                + list(NPM_PACKAGES),
                check=True,
                capture_output=True,
                timeout=600,
            )
    return bin_dir


INSPECTOR_2026 = ("node@22", "@modelcontextprotocol/inspector@2.12")
"""The Inspector that speaks 2026-07-28 (--protocol-era modern) needs Node 22.19 or later,
which npm's node package brings: installed beside the others (<repo>/.cache/inspector-2026),
its install scripts approved (npm 11 runs none unapproved; node's fetches its binary)."""


@pytest.fixture(scope="session")
def inspector_2026() -> list[str]:
    """The 2026-07-28 Inspector's command: its launcher run by Node 22."""
    prefix = SERVERS.parent / "inspector-2026"
    bin_dir = prefix / "node_modules" / ".bin"
    prefix.mkdir(parents=True, exist_ok=True)
    with open(prefix / "install.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if not (bin_dir / "mcp-inspector").exists() or not (bin_dir / "node").exists():
            npm = shutil.which("npm")
            if npm is None:
                pytest.fail("npm is needed to install the MCP Inspector")
            for args in (
                ["install", *INSPECTOR_2026],
                ["install-scripts", "approve", "node", "@modelcontextprotocol/inspector"],
                ["rebuild", "node", "@modelcontextprotocol/inspector"],
            ):
                subprocess.run(
                    [npm, "--prefix", str(prefix), "--no-audit", "--no-fund", *args],
                    cwd=prefix,
                    check=True,
                    capture_output=True,
                    timeout=600,
                )
    return [str(bin_dir / "node"), str((bin_dir / "mcp-inspector").resolve())]


@pytest.fixture(scope="session")
def git_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real repository with COMMITS commits (made with git fast-import, in about a second)."""
    repo = tmp_path_factory.mktemp("repo")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    lines = []
    for n in range(1, COMMITS + 1):
        message = f"Change {n}: adjust the parser for case {n % 97} and update its tests\n"
        content = f"line {n}\n"
        lines += [
            "commit refs/heads/main",
            f"committer Dev {n % 7} <dev{n % 7}@example.com> {1_700_000_000 + n * 60} +0000",
            f"data {len(message.encode())}",
            message.rstrip("\n"),
            f"M 644 inline file{n % 50}.txt",
            f"data {len(content.encode())}",
            content.rstrip("\n"),
            "",
        ]
    subprocess.run(
        ["git", "-C", str(repo), "fast-import", "--quiet"],
        input="\n".join(lines).encode(),
        check=True,
    )
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "main"], check=True)
    return repo
