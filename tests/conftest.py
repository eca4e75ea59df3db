"""Shared fixtures. Tests marked `docker` need a real engine: under CI=true they fail when
none answers (never skip), elsewhere they skip with the reason."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog_backends import (  # noqa: F401
    catalog,
    catalog_url,
    harness_catalog,
    postgres_server,
    postgres_url,
    pytest_generate_tests,
)

TEST_LABEL = "spillbox.test"

# The suite's harnesses (and the harness processes tests start, which inherit this) keep no
# warm pool: a pool fills from a harness's first task, so each would start containers that
# its test never uses. The sandbox tests' `task` fixtures take theirs from one (pooled_task);
# tests/sandbox/test_pool.py sets the pool it tests on its harnesses.
os.environ.setdefault("SPILLBOX_POOL_SIZE", "0")

POOL_FILL_SECONDS = 300.0
"""How long a test waits for a pool slot (a slot starts a fork server and a session)."""


def pooled_task(harness: Any, task_id: str, **kwargs: Any) -> Any:
    """harness.task(task_id), given a ready slot of the harness's warm pool: the path users
    get by default. The pool keeps one slot for this task, then none, so the harness starts
    no container that no test uses; its other tasks start their own (the cold path)."""
    from spillbox.sandbox.docker.pool import RECORD_FILE

    pool = harness.backend.pool
    pool.resize(1)
    assert pool.fill(POOL_FILL_SECONDS), "the warm pool did not fill"
    task = harness.task(task_id, **kwargs)
    pool.resize(0)
    assert (task.storage.root / RECORD_FILE).exists(), "the task did not adopt the slot"
    return task


GVISOR = "runsc"
"""gVisor's OCI runtime: Docker tests run under the engine's default and again under it."""


def runtime_or_skip(docker_client: Any, runtime: str | None) -> str | None:
    """runtime (None: the engine's default), or the test skipped where the engine has no
    such runtime (gVisor is an optional stronger mode)."""
    if runtime is not None and runtime not in docker_client.info().get("Runtimes", {}):
        pytest.skip(
            f"the engine has no {runtime!r} runtime (gVisor is an optional stronger mode): "
            "scripts/ensure-docker.sh installs runsc and registers it"
        )
    return runtime


def _docker_client():  # type: ignore[no-untyped-def]
    import docker

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as e:  # any failure to reach the engine means "no Docker here"
        message = f"Docker engine not reachable ({e}); run scripts/ensure-docker.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return client


@pytest.fixture(scope="session")
def docker_client():  # type: ignore[no-untyped-def]
    client = _docker_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_client) -> str:  # type: ignore[no-untyped-def]
    from spillbox.sandbox.image import ensure_image

    return ensure_image(docker_client)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def docker_home(tmp_path_factory: pytest.TempPathFactory, sandbox_image: str) -> Iterator[Path]:
    """A spillbox home for Docker tests; every container and folder it made is removed after."""
    from spillbox.sandbox.docker import cleanup_home

    path = tmp_path_factory.mktemp("docker-home")
    yield path
    cleanup_home(path)


class Clock:
    """time.time() shifted by an offset the test moves forward."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset = 0.0
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + self.offset)

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def read_all_pages(toolset: Any, **ref: str) -> list[tuple[Any, dict[str, Any]]]:
    """Every page of an artifact through read_artifact, following next_cursor: the tool's
    output and its decoded body, page after page."""
    pages: list[tuple[Any, dict[str, Any]]] = []
    cursor: str | None = None
    while True:
        args: dict[str, Any] = dict(ref)
        if cursor is not None:
            args["cursor"] = cursor
        output = toolset.call("read_artifact", args)
        assert not output.is_error, output.text
        body = json.loads(output.text)
        pages.append((output, body))
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 5_000, "paging does not end"


def joined_text(bodies: list[dict[str, Any]]) -> str:
    """The text of read_artifact's pages joined as the payload was: a page after the first
    of a CSV repeats its header in its first header_lines lines, dropped here."""
    parts = []
    for body in bodies:
        lines = body["text"].splitlines(keepends=True)
        parts.append("".join(lines[body.get("header_lines", 0) :]))
    return "".join(parts)
