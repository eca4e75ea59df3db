"""TablePreload's one kept thread, against a fake engine (tests/sandbox/test_wrapped_sql.py
has the real one load tables in a real sandbox): it is started by the first request and
woken by the next, asks once more for tables that came while it asked, takes the container
again each time, and stops when closed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import spillbox.sandbox.docker.wire as wire
from spillbox.sandbox.docker.channels import Idle
from spillbox.sandbox.docker.sql import TablePreload

WAIT_SECONDS = 30.0


class Container:
    def __init__(self, name: str) -> None:
        self.id = name


class Engine:
    """Answers a preload at once; records the container each came for."""

    def __init__(self, container: Container, asked: list[str], hold: threading.Event) -> None:
        self.container_id = container.id
        self._asked = asked
        self._hold = hold

    def ask(self, request: dict[str, Any], deadline: float) -> Iterator[tuple[str, bytes]]:
        assert request == {"preload": True}
        self._asked.append(self.container_id)
        assert self._hold.wait(WAIT_SECONDS)
        yield wire.END, b""

    def close(self) -> None:
        pass


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    offload = tmp_path / "offload"
    offload.mkdir()
    (offload / "c1.json").write_text("[]")
    return offload


def preload_of(container: list[Container | None]) -> tuple[TablePreload, list[str], Any]:
    asked: list[str] = []
    hold = threading.Event()
    hold.set()
    engines: Idle[Any] = Idle(lambda c: Engine(c, asked, hold))
    return TablePreload(engines, lambda: container[0]), asked, hold


def preloads() -> int:
    """The preload threads alive (the process's spawner thread, started by the first
    preload of the process, is not one)."""
    return sum(thread.name == "spillbox-preload" for thread in threading.enumerate())


def wait_for(what: Any, why: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.01)


def test_one_thread_serves_every_request_and_stops_when_closed(folder: Path) -> None:
    preload, asked, _ = preload_of([Container("a")])
    before = preloads()
    preload.request(folder, [])
    wait_for(lambda: asked == ["a"], "the first request was not asked")
    assert preloads() == before + 1  # kept, waiting for the next
    for n in range(2, 5):
        (folder / f"c{n}.json").write_text("[]")
        preload.request(folder, [f"c{n}.json"])
        wait_for(lambda n=n: len(asked) == n, f"request {n} was not asked")
        assert preloads() == before + 1  # the same thread, woken
    preload.request(folder, [])  # nothing new: nothing asked
    preload.close()
    assert preloads() == before
    assert asked == ["a"] * 4
    (folder / "c9.json").write_text("[]")
    preload.request(folder, ["c9.json"])  # closed: never asked again
    assert asked == ["a"] * 4 and preloads() == before


def test_tables_offloaded_while_it_asks_are_asked_for_after(folder: Path) -> None:
    preload, asked, hold = preload_of([Container("a")])
    hold.clear()
    preload.request(folder, [])
    wait_for(lambda: asked == ["a"], "the first request was not asked")
    (folder / "c2.json").write_text("[]")
    preload.request(folder, ["c2.json"])  # while the first is still being answered
    (folder / "c3.csv").write_text("a\n1\n")
    preload.request(folder, ["c3.csv"])
    hold.set()
    wait_for(lambda: len(asked) == 2, "the tables that came meanwhile were not asked for")
    preload.close()
    assert asked == ["a", "a"]  # the two that came meanwhile in one request


def test_each_request_takes_the_container_running_then(folder: Path) -> None:
    running: list[Container | None] = [Container("a")]
    preload, asked, _ = preload_of(running)
    preload.request(folder, [])
    wait_for(lambda: asked == ["a"], "the first request was not asked")
    running[0] = Container("b")  # the container was replaced (a restart)
    (folder / "c2.json").write_text("[]")
    preload.request(folder, ["c2.json"])
    wait_for(lambda: asked == ["a", "b"], "the new container's engine was not asked")
    preload.close()


def test_a_failed_start_ends_the_thread_and_the_next_request_starts_one(folder: Path) -> None:
    running: list[Container | None] = [None]
    preload, asked, _ = preload_of(running)
    before = preloads()
    preload.request(folder, [])
    wait_for(lambda: preloads() == before, "the thread outlived a failed start")
    assert asked == []
    running[0] = Container("a")
    (folder / "c2.json").write_text("[]")
    preload.request(folder, ["c2.json"])
    wait_for(lambda: asked == ["a"], "no thread asked after the failed start")
    preload.close()
    assert preloads() == before


def test_no_table_no_thread(tmp_path: Path) -> None:
    preload, asked, _ = preload_of([Container("a")])
    before = preloads()
    (tmp_path / "c1.txt").write_text("text")
    preload.request(tmp_path, [])
    preload.request(tmp_path / "missing", [])
    assert preloads() == before
    preload.close()
    assert asked == []


def test_the_folder_is_listed_at_the_first_request_only(folder: Path) -> None:
    """The first request finds the tables already there (an earlier process's); after it,
    a request asks about the files it is told were published, the folder unread (here it
    is gone: a listing would find nothing to ask for)."""
    preload, asked, _ = preload_of([Container("a")])
    preload.request(folder, [])  # c1.json, there before
    wait_for(lambda: asked == ["a"], "the table already there was not asked for")
    folder.rename(folder.with_name("elsewhere"))
    preload.request(folder, ["c2.txt"])  # no table
    preload.request(folder, ["c3.json"])
    wait_for(lambda: len(asked) == 2, "a published table was not asked for")
    preload.close()
    assert asked == ["a", "a"]


def test_a_caller_that_does_not_know_what_was_published_has_the_folder_listed(
    folder: Path,
) -> None:
    """A cluster's host warms a task without the names its harnesses published."""
    preload, asked, _ = preload_of([Container("a")])
    preload.request(folder)
    wait_for(lambda: asked == ["a"], "the table already there was not asked for")
    (folder / "c2.json").write_text("[]")
    preload.request(folder)
    wait_for(lambda: len(asked) == 2, "the folder was not listed again")
    preload.close()
