"""One exec's output as the host reads it: the raw connection (ExecStream), its frames read
with the container watched (watched_frames), and a cap on what is kept (CappedBuffer)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import docker

from spillbox.sandbox.docker.state import State, state
from spillbox.sandbox.docker_errors import best_effort

OUTPUT_TAIL_BYTES = 64 * 1024
WATCH_SECONDS = 1.0
"""How long an exec's output may be quiet before its container is asked whether it runs."""

Late = tuple[float, Callable[[], object]]
"""(monotonic time, action): what to do once, if the output is still open at that time."""


class SandboxDied(Exception):
    """The container stopped while an exec's output was still open."""

    def __init__(self, state: State) -> None:
        super().__init__("the sandbox stopped")
        self.state = state


class GaveUp(Exception):
    """An exec's output stayed open past its last deadline."""


class ExecStream:
    """One exec's raw connection: stdin to write, stdout/stderr frames to read.

    Docker multiplexes the two outputs in frames (8-byte header: stream, size). We read
    the socket ourselves so that closing it really closes it, and so a timeout on it is
    ours to set.
    """

    def __init__(
        self, api: Any, container_id: str, cmd: list[str], user: str, stdin: bool, home: str
    ) -> None:
        # Docker's errors pass through: the session runs an exec into a stopped container
        # once more, in a restarted one.
        self.exec_id: str = api.exec_create(
            container_id, cmd, stdin=stdin, user=user, workdir=home, environment={"HOME": home}
        )["Id"]
        self._raw = api.exec_start(self.exec_id, socket=True)
        self._sock: socket.socket = getattr(self._raw, "_sock", self._raw)
        self._pending = bytearray()
        """Bytes received and not yet returned: a timeout mid-frame loses nothing."""

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def frame(self) -> tuple[int, bytes] | None:
        """The next (stream, payload): 1 is stdout, 2 is stderr; None at end of output.

        A socket timeout (TimeoutError) keeps what came; the next call goes on from there.
        """
        if not self._fill(8):
            return None
        size = struct.unpack(">I", self._pending[4:8])[0]
        if not self._fill(8 + size):
            return None
        kind, data = self._pending[0], bytes(self._pending[8 : 8 + size])
        del self._pending[: 8 + size]
        return kind, data

    def _fill(self, size: int) -> bool:
        """Receive until `size` bytes are pending; False at the end of the output."""
        while len(self._pending) < size:
            chunk = self._sock.recv(max(size - len(self._pending), 1 << 16))
            if not chunk:
                return False
            self._pending += chunk
        return True

    def close(self) -> None:
        for closable in (self._raw, self._sock):
            try:
                closable.close()
            except OSError:
                pass


def watched_frames(
    stream: ExecStream,
    container: Any,
    client: docker.DockerClient,
    give_up_at: float,
    late: Late | None = None,
) -> Iterator[tuple[int, bytes]]:
    """The frames of an exec's output until it ends, with its container watched.

    Whenever the output has been quiet for WATCH_SECONDS the container is asked whether it
    still runs: SandboxDied if not (SANDBOX_STOPPED in outcome.py says why). Past late's
    time its action runs once; past give_up_at (monotonic), GaveUp. Short execs end before
    the first check and cost no extra call.
    """
    stream.settimeout(WATCH_SECONDS)
    check_at = time.monotonic() + WATCH_SECONDS
    while True:
        now = time.monotonic()
        if now >= check_at:
            check_at = now + WATCH_SECONDS
            if now >= give_up_at:
                raise GaveUp
            if late is not None and now >= late[0]:
                late[1]()
                late = None
            # The engine busy or restarting: the deadlines hold.
            seen = best_effort(partial(state, container, client), {"Running": True})
            if not seen.get("Running"):
                raise SandboxDied(seen)
        try:
            frame = stream.frame()
        except TimeoutError:
            continue  # quiet for WATCH_SECONDS: check again
        if frame is None:
            return
        yield frame


class CappedBuffer:
    """Keeps the first `cap` bytes and the last OUTPUT_TAIL_BYTES; counts what it drops."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > OUTPUT_TAIL_BYTES:
                excess = len(self.tail) - OUTPUT_TAIL_BYTES
                self.dropped += excess
                del self.tail[:excess]

    def value(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        marker = f"\n[spillbox: {self.dropped} bytes of output dropped here]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)
