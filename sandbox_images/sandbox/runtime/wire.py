"""The frames spillbox's runners write to the host: one byte of kind, four bytes of length
(big-endian), the data. Every runner answers a request so: the fork server's relay, the
Python session's relay, the SQL engine's relay and takeout.py.

The host's copy of these names is spillbox/sandbox/docker/wire.py: the image cannot import
the host package (spillbox is not installed here), so this file is the one copy inside the
image, and tests/test_wire.py checks that the two agree.
"""

from __future__ import annotations

import struct

STARTED = b"S"
"""The runner took the request: from here on, the script or cell ran."""
NO_SERVER = b"N"
"""No fork server answers: the host starts one (the relay waits for it)."""
STDOUT = b"1"
STDERR = b"2"
END = b"E"
"""The last frame of an answer, a JSON object: a script's or cell's {"exit_code",
"oom_killed", "outputs"}, or the SQL engine's answer."""
FILE = b"F"
"""takeout.py: a file taken (its name in UTF-8, a newline, its bytes)."""
NOTE = b"n"
"""takeout.py: one line about an entry not taken."""


def frame(out: object, kind: bytes, data: bytes | str) -> None:
    if isinstance(data, str):
        data = data.encode("utf-8", "backslashreplace")
    out.write(kind + struct.pack(">I", len(data)) + data)  # type: ignore[attr-defined]
    out.flush()  # type: ignore[attr-defined]
