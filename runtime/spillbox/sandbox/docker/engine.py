"""The connection to a sandbox's SQL engine: one exec of the relay (`sqlserver.py`), spoken to
over its stdin and stdout, one JSON line each way per query."""

from __future__ import annotations

import json
import threading
import time
from functools import partial
from typing import Any

import docker

from spillbox.errors import ExecError
from spillbox.sandbox.docker.layout import CACHE_MOUNT, ENGINE_UID, ENGINE_USER, SQL_ENGINE
from spillbox.sandbox.docker.outcome import KILL_GRACE_SECONDS
from spillbox.sandbox.docker.stream import ExecStream, GaveUp, watched_frames
from spillbox.sandbox.docker_errors import best_effort


class SqlEngine:
    """The task's long-lived DuckDB process, spoken to over one exec's stdin/stdout.

    Its failures are ExecErrors marked retryable: a query only reads, so running it again
    (on a fresh connection) is safe.
    """

    def __init__(self, client: docker.DockerClient, container: Any) -> None:
        self.container_id = container.id
        self._client = client
        self._container = container
        self._lock = threading.Lock()
        self._stream = ExecStream(
            client.api,
            container.id,
            ["python3", SQL_ENGINE],
            user=ENGINE_USER,
            stdin=True,
            home=CACHE_MOUNT,  # DuckDB keeps its own files in HOME
        )
        self._buffer = bytearray()
        self._errors = bytearray()

    def query(self, sql: str, timeout: float, max_bytes: int) -> dict[str, Any] | None:
        """The engine's response, or None if it did not answer within timeout + grace.

        Raises SandboxDied if the container stopped under the query.
        """
        request = json.dumps({"sql": sql, "timeout": timeout, "max_bytes": max_bytes}) + "\n"
        with self._lock:
            try:
                self._stream.send(request.encode("utf-8"))
                line = self._read_line(time.monotonic() + timeout + KILL_GRACE_SECONDS)
            except GaveUp:
                return None
            except OSError as e:
                raise ExecError(
                    f"the SQL engine's connection broke: {e}; run the query again", retryable=True
                ) from e
        try:
            response: dict[str, Any] = json.loads(line)
        except ValueError:
            # Docker writes why an exec could not start (a container stopping under it)
            # into the exec's stream as plain text.
            said = line.decode("utf-8", "replace").strip()[:200]
            error = ExecError(
                f"the SQL engine did not answer ({said}); run the query again", retryable=True
            )
            raise error from None
        return response

    def _read_line(self, give_up_at: float) -> bytes:
        frames = watched_frames(self._stream, self._container, self._client, give_up_at)
        while b"\n" not in self._buffer:
            frame = next(frames, None)
            if frame is None:
                detail = self._errors.decode("utf-8", "replace").strip().splitlines()
                last = detail[-1] if detail else "no error message"
                raise ExecError(
                    f"the SQL engine stopped: {last}; run the query again", retryable=True
                )
            stream, payload = frame
            (self._buffer if stream == 1 else self._errors).extend(payload)
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line

    def kill(self) -> None:
        """Kill the engine process and drop the connection."""
        kill_engines(self._container)
        self.close()

    def close(self) -> None:
        self._stream.close()


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
