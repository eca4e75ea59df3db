"""Taking the files a call left in /sandbox/outputs (takeout.py in the image, as the engine
uid: no script can stop or steer it), which empties the folder; what was not taken is named
in the notes."""

from __future__ import annotations

import time
from typing import Any

import docker

import spillbox.sandbox.docker.wire as wire
from spillbox.sandbox.docker.layout import ENGINE_USER, TAKEOUT_SCRIPT, WORK_MOUNT
from spillbox.sandbox.docker.stream import ExecStream, GaveUp, SandboxDied, watched_frames
from spillbox.sandbox.docker_errors import docker_errors
from spillbox.types import OutputFile

MAX_OUTPUT_FILES = 32
"""Files taken from /sandbox/outputs after one call; the rest are removed, and named."""
MAX_OUTPUT_FILE_BYTES = 32 * 1024 * 1024
TAKEOUT_SECONDS = 60.0
"""How long taking the output files may last (at most the folder's cap, read in memory)."""
ERRORS_SHOWN_BYTES = 4096


def take_outputs(
    client: docker.DockerClient, container: Any
) -> tuple[tuple[OutputFile, ...], tuple[str, ...]]:
    """The files taken, and the notes on what was not."""
    command = [
        *("python3", "-S", TAKEOUT_SCRIPT, "collect"),
        *(str(MAX_OUTPUT_FILES), str(MAX_OUTPUT_FILE_BYTES)),
    ]
    files: list[OutputFile] = []
    notes: list[str] = []
    errors = bytearray()
    frames = wire.Frames()
    with docker_errors("taking the files a script left in /sandbox/outputs"):
        stream = ExecStream(
            client.api, container.id, command, ENGINE_USER, stdin=False, home=WORK_MOUNT
        )
        try:
            give_up_at = time.monotonic() + TAKEOUT_SECONDS
            for kind, data in watched_frames(stream, container, client, give_up_at):
                if kind != 1:
                    errors += data[: ERRORS_SHOWN_BYTES - len(errors)]
                    continue
                frames.feed(data)
                for tag, body in frames:
                    if tag == wire.FILE:
                        name, _, content = body.partition(b"\n")
                        files.append(OutputFile(name.decode("utf-8"), content))
                    else:
                        notes.append(body.decode("utf-8", "replace"))
        except (GaveUp, SandboxDied, OSError) as e:
            why = {
                GaveUp: f"it took over {TAKEOUT_SECONDS:g} s",
                SandboxDied: "the sandbox stopped",
            }.get(type(e), f"the connection broke: {e}")
            notes.append(f"the output files could not all be taken ({why}): write them again")
        finally:
            stream.close()
    if errors:
        notes.append(f"taking the output files failed: {_last_line(bytes(errors))}")
    return tuple(files), tuple(notes)


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""
