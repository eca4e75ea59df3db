"""Real MCP servers for the proxy's tests, installed from their registries: npm's
server-everything and server-filesystem, and the MCP Inspector as a second client (into
<repo>/.cache/mcp-servers, once), and PyPI's mcp-server-git (a dev dependency). Test
modules load these fixtures with `pytest_plugins = ["mcp_fixtures"]` (a second conftest.py
would shadow the suite's own).
"""

from __future__ import annotations

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
    if not all(path.exists() for path in wanted):
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("npm is needed to install the MCP test servers (Node 20)")
        SERVERS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(SERVERS), *NPM_PACKAGES],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return bin_dir


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
