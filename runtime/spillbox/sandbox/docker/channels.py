"""Kept connections into a sandbox's runners: one exec of a runner's relay, kept open between
calls and spoken to in the frame protocol of wire.py (a JSON request line in, frames out,
the answer's last frame END).

A `docker exec` per call costs a round trip to the engine and a fresh interpreter; a kept
channel costs neither. Three runners are spoken to so:

- ScriptChannel: the fork server's relay (forkserver.py), as the engine uid, so a script
  can neither kill it nor read what another script asked; it starts the fork server when
  the relay finds none.
- SessionChannel: the Python session's relay (session.py), as the session uid.
- SqlChannel: the SQL engine's relay (sqlserver.py), as the engine uid.

Idle keeps the channels a host process is not using, for the next call into the same
container.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, ClassVar, Generic, TypeVar

import docker

import spillbox.sandbox.docker.wire as wire
from spillbox.errors import ExecError
from spillbox.sandbox.docker.layout import (
    CACHE_MOUNT,
    ENGINE_UID,
    ENGINE_USER,
    FORK_SERVER,
    SCRIPT_USER,
    SESSION_SCRIPT,
    SESSION_USER,
    SQL_ENGINE,
    WORK_MOUNT,
)
from spillbox.sandbox.docker.outcome import KILL_GRACE_SECONDS
from spillbox.sandbox.docker.stream import ExecStream, GaveUp, Late, watched_frames
from spillbox.sandbox.docker_errors import best_effort

ERRORS_KEPT_BYTES = 4096
"""How much of what a relay itself wrote on stderr is kept (the end says why it failed)."""


class Channel:
    """One kept exec of a runner's relay; answers one request at a time.

    >>> channel = ScriptChannel(client, container)  # doctest: +SKIP
    >>> for kind, data in channel.ask({"lang": "sh", ...}, give_up_at): ...  # doctest: +SKIP
    """

    command: ClassVar[tuple[str, ...]]
    user: ClassVar[str]
    home: ClassVar[str]

    def __init__(self, client: docker.DockerClient, container: Any) -> None:
        self.container_id: str = container.id
        self._client = client
        self._container = container
        self._stream = ExecStream(
            client.api, container.id, list(self.command), self.user, stdin=True, home=self.home
        )
        self._frames = wire.Frames()
        self._errors = bytearray()

    def ask(
        self, request: dict[str, Any], give_up_at: float, late: Late | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The answer's frames, up to and with its END: (kind, data).

        Ends early (without END) if the relay's output ends; raises as watched_frames does
        (SandboxDied, GaveUp), and OSError if the connection breaks.
        """
        self._stream.send(wire.request(request))
        frames = watched_frames(self._stream, self._container, self._client, give_up_at, late)
        for stream, payload in frames:
            if stream != 1:
                self._errors = (self._errors + payload)[-ERRORS_KEPT_BYTES:]
                continue
            self._frames.feed(payload)
            for kind, data in self._frames:
                if self._answered_here(kind):
                    continue
                yield kind, data
                if kind == wire.END:
                    return

    def _answered_here(self, kind: bytes) -> bool:
        """Whether a frame is the channel's own business, not the caller's."""
        return False

    def said(self) -> str:
        """The last line the relay wrote on stderr, or what came that is no frame."""
        for text in (bytes(self._errors), self._frames.leftover()):
            lines = text.decode("utf-8", "replace").strip().splitlines()
            if lines:
                return lines[-1][:200]
        return "no error message"

    def close(self) -> None:
        self._stream.close()


class ScriptChannel(Channel):
    """The fork server's relay: stateless scripts, one at a time."""

    command = ("python3", "-S", FORK_SERVER, "relay")  # -S: no site-packages, a faster start
    user = ENGINE_USER
    home = WORK_MOUNT

    def _answered_here(self, kind: bytes) -> bool:
        if kind != wire.NO_SERVER:
            return False
        self._start_server()
        return True

    def _start_server(self) -> None:
        """Start the fork server, as the script uid, detached: it lives as long as the
        sandbox (or until a script kills it; the next relay starts another)."""
        api = self._client.api
        created = api.exec_create(
            self.container_id,
            ["python3", FORK_SERVER, "serve"],
            user=SCRIPT_USER,
            workdir=WORK_MOUNT,
            environment={"HOME": WORK_MOUNT},
        )
        api.exec_start(created["Id"], detach=True)


class SessionChannel(Channel):
    """The Python session's relay: the task's cells, one at a time (session.py)."""

    command = ("python3", "-S", SESSION_SCRIPT, "relay")
    user = SESSION_USER
    home = WORK_MOUNT


class SqlChannel(Channel):
    """The task's long-lived DuckDB process, through its relay.

    Its failures are ExecErrors marked retryable: a query only reads, so running it again
    (on a fresh connection) is safe.
    """

    command = ("python3", SQL_ENGINE)
    user = ENGINE_USER
    home = CACHE_MOUNT  # DuckDB keeps its own files in HOME

    def query(self, sql: str, timeout: float, max_bytes: int) -> dict[str, Any] | None:
        """The engine's answer, or None if it did not answer within timeout + grace.

        Raises SandboxDied if the container stopped under the query.
        """
        request = {"sql": sql, "timeout": timeout, "max_bytes": max_bytes}
        give_up_at = time.monotonic() + timeout + KILL_GRACE_SECONDS
        answer = None
        try:
            for kind, data in self.ask(request, give_up_at):
                if kind == wire.END:
                    answer = data
        except GaveUp:
            return None
        except OSError as e:
            raise ExecError(
                f"the SQL engine's connection broke: {e}; run the query again", retryable=True
            ) from e
        if answer is None:
            raise ExecError(
                f"the SQL engine stopped: {self.said()}; run the query again", retryable=True
            )
        try:
            response: dict[str, Any] = json.loads(answer)
        except ValueError:
            raise ExecError(
                "the SQL engine's answer was not JSON; run the query again", retryable=True
            ) from None
        return response

    def kill(self) -> None:
        """Kill the engine process and drop the connection."""
        kill_engines(self._container)
        self.close()


def kill_engines(container: Any) -> None:
    """Kill every SQL engine process in the container (as the engine's own uid)."""
    # A container that is gone took its engines with it.
    best_effort(
        partial(
            container.exec_run,
            ["pkill", "-KILL", "-u", str(ENGINE_UID), "-f", SQL_ENGINE],
            user=ENGINE_USER,
        ),
        None,
    )


C = TypeVar("C", bound=Channel)


class Idle(Generic[C]):
    """The channels of one kind a host process is not using now, kept for the next call:
    taken one per call (two calls at once get two channels), given back when they answered
    whole. drop() closes them all, and one taken before it is closed when given back."""

    def __init__(self, make: Callable[[Any], C]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._idle: list[C] = []
        self._generation = 0

    def take(self, container: Any) -> tuple[C, int]:
        """An idle channel into this container (one into another is closed), or a new one;
        and the generation to give it back with."""
        with self._lock:
            generation = self._generation
            while self._idle:
                channel = self._idle.pop()
                if channel.container_id == container.id:
                    return channel, generation
                channel.close()
        return self._make(container), generation

    def give_back(self, channel: C, generation: int, reusable: bool) -> None:
        with self._lock:
            if reusable and generation == self._generation:
                self._idle.append(channel)
                return
        channel.close()

    def keep(self, channel: C) -> None:
        """Keep a channel opened before anyone asked (a warm pool slot's) for the next call."""
        with self._lock:
            self._idle.append(channel)

    def drop(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for channel in idle:
            channel.close()
