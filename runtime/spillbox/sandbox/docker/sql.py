"""One query (lang "sql") in the task's SQL engine, over a kept SqlChannel; its endings are
the query paragraph of outcome.py. And TablePreload, which has the engine load the task's
tables in the background once a payload is offloaded."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection
from functools import partial
from pathlib import Path
from typing import Any

import docker

import spillbox.sandbox.docker.wire as wire
from spillbox.errors import ExecError, retry
from spillbox.sandbox.docker.answers import engine_answer
from spillbox.sandbox.docker.channels import Idle, SqlChannel, kill_engines
from spillbox.sandbox.docker.outcome import EXIT_KILLED, STOPPED_NOTE
from spillbox.sandbox.docker.scripts import NeverStarted
from spillbox.sandbox.docker.state import memory_ran_out, settled_state
from spillbox.sandbox.docker.stream import GaveUp, SandboxDied
from spillbox.sandbox.docker_errors import DOCKER_FAILURES
from spillbox.spawn import Spawned, spawn
from spillbox.types import RawExec

QUERY_ATTEMPTS = 2
"""A query whose engine died under it runs once more, on a fresh engine: it only reads."""
EXIT_QUERY_KILLED = 124
TABLE_EXTENSIONS = ("json", "ndjson", "csv")
"""The payloads the SQL engine loads as tables (sqlserver.py's READERS)."""
PRELOAD_ANSWER_SECONDS = 60.0
"""How long the engine may take to take a preload (its start, on a loaded machine: it
imports duckdb); the loads themselves run after its answer."""


def run_query(
    engines: Idle[SqlChannel],
    client: docker.DockerClient,
    container: Any,
    code: str,
    limits: tuple[float, int],
    forget: Callable[[], None],
) -> RawExec:
    """The query's result; limits: its timeout and the most stdout it may give. Raises
    NeverStarted when the container stopped before the engine could answer; forget runs
    when it stopped under the query."""
    timeout, max_bytes = limits
    since = time.time()
    try:
        response = retry(
            partial(_query, engines, container, code, timeout, max_bytes), QUERY_ATTEMPTS
        )
    except ExecError:
        # Both attempts failed. A container being killed can still show as running for
        # a moment while Docker refuses to exec into it ("setns process: exit status 1"),
        # so its state is read once it settles: stopped, the query runs again after the
        # restart; still running, the engine itself failed and the error stands.
        if settled_state(container, client).get("Running"):
            raise
        raise NeverStarted from None
    except SandboxDied as died:
        forget()
        oom = memory_ran_out(container, client, died.state, since)
        return RawExec(
            exit_code=EXIT_KILLED, stdout=b"", stderr=STOPPED_NOTE, timed_out=False, oom_killed=oom
        )
    if response is None:
        engines.drop()
        kill_engines(container)
        return RawExec(
            exit_code=EXIT_QUERY_KILLED,
            stdout=b"",
            stderr=b"query killed: it ran past its timeout",
            timed_out=True,
            oom_killed=False,
        )
    answer = engine_answer(response)
    return RawExec(
        exit_code=answer.exit_code,
        stdout=answer.stdout.encode("utf-8"),
        stderr=answer.stderr.encode("utf-8"),
        timed_out=answer.timed_out,
        oom_killed=False,
        stdout_truncated=answer.truncated,
    )


def _query(
    engines: Idle[SqlChannel], container: Any, code: str, timeout: float, max_bytes: int
) -> dict[str, Any] | None:
    engine, generation = engines.take(container)
    try:
        response = engine.query(code, timeout, max_bytes)
    except BaseException:
        engines.give_back(engine, generation, reusable=False)
        raise
    engines.give_back(engine, generation, reusable=response is not None)
    return response


class TablePreload:
    """Has the task's SQL engine load every table-shaped payload in the background, newest
    first, once the sandbox is up: the parse (about 1 s for 26 MB of JSON) is paid while the
    model reads the notice, not by its first query. The engine answers the request at once
    and loads in a thread of its own, so no exec or query waits for it (a query that names
    a table being loaded waits for that load only). It loads only the payloads present
    then: one deleted since is not loaded.

    >>> preload = TablePreload(engines, sandbox.up)  # doctest: +SKIP
    >>> preload.request(storage.offload)  # after an offload  # doctest: +SKIP
    """

    def __init__(self, engines: Idle[SqlChannel], up: Callable[[], Any | None]) -> None:
        self._engines = engines
        self._up = up
        """The running container once the sandbox's start is over, None if it failed."""
        self._changed = threading.Condition()
        self._asked: frozenset[str] = frozenset()
        self._listed = False
        """Whether the folder was listed once (what the first request asks about)."""
        self._wanted = False
        self._thread: Spawned | None = None
        """Started by the first request and kept, waiting for the next: a thread started
        per offload cost the step that asked about 0.5 ms (Thread.start waits for the new
        thread, which then holds the GIL), where waking a waiting one costs it nothing;
        the first is spawned (spillbox.spawn), not started by the step."""
        self._closed = False

    def request(self, folder: Path, published: Collection[str] | None = None) -> None:
        """Ask for a preload if a table came that the engine was not asked to load yet:
        among published, the files stored since the last request; or among the files in
        folder (the task's payloads) at the first request (an earlier process's) and
        wherever published is None (a cluster's host, which links what its harnesses
        publish). Asked after every step: a listing per step took ~1 ms of each offload at
        2,000 payloads."""
        names: Collection[str] | None = published
        if names is None or not self._listed:
            try:
                names = os.listdir(folder)
            except OSError:
                return  # no payload yet
            self._listed = True
        tables = frozenset(name for name in names if name.rpartition(".")[2] in TABLE_EXTENSIONS)
        with self._changed:
            if self._closed or tables <= self._asked:
                return
            self._asked |= tables
            self._wanted = True
            if self._thread is not None:
                self._changed.notify()  # the kept thread asks once more
                return
            self._thread = spawn(self._run, "spillbox-preload")

    def close(self) -> None:
        """Ask for no more preloads; wait for the one being asked for."""
        with self._changed:
            self._closed = True
            self._changed.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not (self._wanted or self._closed):
                    self._changed.wait()
                self._wanted = False
                if self._closed:
                    return
            container = self._up()  # again each time: the container may have been replaced
            if container is None:
                with self._changed:
                    self._thread = None  # the next request starts over
                return
            self._ask(container)

    def _ask(self, container: Any) -> None:
        try:
            engine, generation = self._engines.take(container)
        except DOCKER_FAILURES:
            return  # the container stopped: the first query loads what it names
        answered = False
        try:
            for kind, _ in engine.ask({"preload": True}, time.monotonic() + PRELOAD_ANSWER_SECONDS):
                answered = kind == wire.END
        except (GaveUp, SandboxDied, OSError):
            pass  # the engine stopped (a deletion stops it): the next query starts one
        self._engines.give_back(engine, generation, answered)
