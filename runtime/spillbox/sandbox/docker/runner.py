"""The fast path of a stateless script: a relay into the sandbox's fork server
(forkserver.py in the image), one exec kept open between calls, spoken to over its stdin and
stdout.

A `docker exec` per script costs a round trip to the engine and a fresh interpreter; a kept
relay costs neither, and the fork server's children start with duckdb, pyarrow and jq
imported. The relay runs as the engine uid, so a script can neither kill it nor read what
another script asked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import docker

from spillbox.sandbox.docker.layout import (
    ENGINE_USER,
    FORK_SERVER,
    SCRIPT_USER,
    WORK_MOUNT,
)
from spillbox.sandbox.docker.stream import ExecStream, Frames, Late, watched_frames

STARTED = b"S"
"""The fork server forked the script: from here on, it ran."""
NO_SERVER = b"N"
STDOUT = b"1"
STDERR = b"2"
END = b"E"


class Runner:
    """One relay into the sandbox's fork server; runs one script at a time.

    >>> runner = Runner(client, container)  # doctest: +SKIP
    >>> for kind, data in runner.run("sh", "echo hi", 10, give_up_at, late): ...  # doctest: +SKIP
    """

    def __init__(self, client: docker.DockerClient, container: Any) -> None:
        self.container_id = container.id
        self._client = client
        self._container = container
        self._stream = ExecStream(
            client.api,
            container.id,
            ["python3", "-S", FORK_SERVER, "relay"],  # -S: no site-packages, a faster start
            user=ENGINE_USER,
            stdin=True,
            home=WORK_MOUNT,
        )
        self._frames = Frames()
        self.errors = bytearray()
        """What the relay itself wrote on stderr (why it failed, if it did)."""

    def run(
        self, lang: str, code: str, timeout: float, give_up_at: float, late: Late
    ) -> Iterator[tuple[bytes, bytes]]:
        """The relay's frames for one script, up to and with its END: (kind, data).

        Ends early (without END) if the relay's output ends; raises as watched_frames does
        (SandboxDied, GaveUp). NO_SERVER is answered here: the fork server is started.
        """
        request = json.dumps({"lang": lang, "code": code, "timeout": timeout}) + "\n"
        self._stream.send(request.encode("utf-8"))
        frames = watched_frames(self._stream, self._container, self._client, give_up_at, late)
        for stream, payload in frames:
            if stream != 1:
                self.errors += payload
                continue
            self._frames.feed(payload)
            for kind, data in self._frames:
                if kind == NO_SERVER:
                    self._start_server()
                    continue
                yield kind, data
                if kind == END:
                    return

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

    def close(self) -> None:
        self._stream.close()
