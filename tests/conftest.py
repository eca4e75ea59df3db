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
    catalog_url,
    harness_catalog,
    postgres_server,
    postgres_url,
    pytest_generate_tests,
)

TEST_LABEL = "spillbox.test"


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
