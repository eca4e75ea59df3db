"""A task's history: every archived turn in one NDJSON artifact, appended to.

The fallback compaction archives the turns it moves out of a request here, and the loop
records every turn here when asked (run(..., record_turns=True)): one JSON message a line,
so one SQL table and one file for grep hold every earlier turn, and search_artifacts finds
any of them.

    history = History(task)
    span = history.append(messages)   # span.first..span.last: their lines in the history
    span.admitted.text                # the notice of the history as it now is

An artifact is stored whole under its sha256, so appending stores the history again with
the new lines after the old ones (its bytes begin with the previous copy's, byte for byte):
the newest copy holds every turn, never a chain to walk back through. Every copy has the
call id HISTORY_REF, which is no artifact's id, so that reference always opens the newest;
line positions never change. The copies it supersedes are left to the task's retention,
not deleted: deleting an artifact also stops the sandbox's Python session and removes the
work files made since it was stored (the retention path forgets what a payload may have
left), a price no append should make the model pay.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spillbox.types import ToolResult

if TYPE_CHECKING:
    from spillbox.protocols import TaskHandle
    from spillbox.types import Admitted, ArtifactRow

HISTORY_TOOL = "spillbox_history"
"""The tool name the task's history is stored under (list_artifacts shows it)."""
HISTORY_REF = "spillbox:history"
"""The call id every copy of the history is stored under; not a plain file name, so no
artifact id equals it, and read_artifact and Task.artifact find the newest copy by it."""


@dataclass(frozen=True)
class Span:
    """Where appended messages are in the history: lines first to last (0-based, as
    read_artifact's positions count records), and the stored history."""

    first: int
    last: int
    admitted: Admitted
    """The history as stored after the append: its artifact and its notice."""

    @property
    def artifact_id(self) -> str:
        assert self.admitted.artifact is not None  # an offload always has one
        return self.admitted.artifact.id


class History:
    """One task's history of turns; every History of a task appends to the same one.

    >>> span = History(task).append([{"role": "user", "content": "hi"}])  # doctest: +SKIP
    >>> (span.first, span.last)  # doctest: +SKIP
    (0, 0)
    """

    def __init__(self, task: TaskHandle) -> None:
        self.task = task
        self._row: str | None = None
        """The artifact id of the history copy _data holds (None: no history yet)."""
        self._data = b""
        self._count = 0
        """Lines in _data."""
        self._lines: dict[bytes, int] = {}
        """The digest of each line held, to its first position."""

    def append(self, messages: Sequence[Mapping[str, Any]], skip_known: bool = False) -> Span:
        """Store messages after the history's last line; their span.

        skip_known: a message whose line the history already holds is not stored again
        (the loop recorded it before a compaction archived it); the span covers the line
        it already has.
        """
        self._refresh()
        new: list[bytes] = []
        positions: list[int] = []
        for message in messages:
            line = _line(message)
            known = self._lines.get(_digest(line)) if skip_known else None
            if known is None:
                known = self._count + len(new)
                new.append(line)
            positions.append(known)
        admitted = self._store(self._data + b"".join(new))
        return Span(min(positions, default=self._count), max(positions, default=0), admitted)

    def _refresh(self) -> None:
        """Follow the task's live history: another History (or process) may have
        appended since, and retention may have removed it."""
        latest = newest(self.task.artifacts())
        if (latest.artifact_id if latest else None) != self._row:
            self._row, self._data, self._count, self._lines = None, b"", 0, {}
            if latest is not None:
                self._row = latest.artifact_id
                self._index(self.task.read(latest, actor=HISTORY_TOOL))

    def _index(self, data: bytes) -> None:
        """Take data (whole lines) after what is held, remembering each line's position."""
        for line in data.splitlines(keepends=True):
            self._lines.setdefault(_digest(line), self._count)
            self._count += 1
        self._data += data

    def _store(self, data: bytes) -> Admitted:
        """Store data as the history (the same bytes again: the stored copy's notice)."""
        admitted = self.task.offload(ToolResult(HISTORY_REF, HISTORY_TOOL, data.decode("utf-8")))
        assert admitted.artifact is not None  # an offload always stores
        self._row = admitted.artifact.id
        self._index(data[len(self._data) :])
        return admitted


_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
"""Characters JSON may leave raw that some line readers (str.splitlines, DuckDB's NDJSON
reader) take as a line's end: escaped, so a record is always one line to every reader."""


def _line(message: Mapping[str, Any]) -> bytes:
    """One message as one line of the history: JSON, readable unicode, escaped breaks (the
    same message to json.loads)."""
    return json.dumps(message, ensure_ascii=False).translate(_BREAKS).encode("utf-8") + b"\n"


def newest(rows: Sequence[ArtifactRow]) -> ArtifactRow | None:
    """The newest live copy of the history among a task's artifacts (oldest first)."""
    return next((r for r in reversed(rows) if r.tool == HISTORY_TOOL and r.state == "live"), None)


def _digest(line: bytes) -> bytes:
    return hashlib.sha256(line.rstrip(b"\n")).digest()
