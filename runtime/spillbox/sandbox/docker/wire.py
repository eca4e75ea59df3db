"""The one frame protocol between the host and spillbox's runners in the sandbox.

A host process keeps an exec of a runner's relay open (channels.py) and writes it one
request a line, a JSON object, on its stdin; the relay answers in frames on its stdout: one
byte of kind, four bytes of length (big-endian), the data, the answer's last frame being
END. The fork server's relay, the Python session's relay and the SQL engine's relay speak
it, and takeout.py writes its files so.

The image keeps its own copy of these names in sandbox_images/sandbox/runtime/wire.py (the
image cannot import this package); tests/test_wire.py checks that the two agree.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

STARTED = b"S"
"""The runner took the request: from here on, the script or cell ran."""
NO_SERVER = b"N"
"""No fork server answers: the host starts one (the relay waits for it)."""
STDOUT = b"1"
STDERR = b"2"
END = b"E"
"""The last frame of an answer, a JSON object: a script's or cell's {"exit_code",
"oom_killed", "outputs"} (answers.script_end), or the SQL engine's answer."""
FILE = b"F"
"""takeout.py: a file taken (its name in UTF-8, a newline, its bytes)."""
NOTE = b"n"
"""takeout.py: one line about an entry not taken."""


def request(fields: dict[str, Any]) -> bytes:
    """One request line."""
    return (json.dumps(fields) + "\n").encode("utf-8")


class Frames:
    """Frames fed in any pieces, read back whole.

    >>> frames = Frames()
    >>> frames.feed(b"F" + (2).to_bytes(4, "big") + b"hi" + b"E")
    >>> list(frames)
    [(b'F', b'hi')]
    """

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, data: bytes) -> None:
        self._pending += data

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        """The complete frames received so far (a partial one waits for more)."""
        while len(self._pending) >= 5:
            size = struct.unpack(">I", self._pending[1:5])[0]
            if len(self._pending) < 5 + size:
                return
            kind, data = bytes(self._pending[:1]), bytes(self._pending[5 : 5 + size])
            del self._pending[: 5 + size]
            yield kind, data

    def leftover(self) -> bytes:
        """What came that is no whole frame (Docker writes why an exec could not start
        into its output as plain text)."""
        return bytes(self._pending[:200])
