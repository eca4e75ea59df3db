"""A task's history: every archived turn in one NDJSON artifact, appended to.

The fallback compaction archives the turns it moves out of a request here, and the loop
records every turn here when asked (run(..., record_turns=True)): one JSON message a line,
so one SQL table and one file for grep hold every earlier turn, and search_artifacts finds
any of them.

    history = History(task)
    span = history.append(messages)   # span.first..span.last: their lines in the history
    span.admitted.text                # the notice of the history as it now is

The history is one artifact, grown in place (Task.append): each append writes only its new
lines after the old ones and updates the artifact's row (size, sha256, tokens) under the
task's append lock, so appends from several processes land one after another, none lost;
line positions never change, and N appends store each byte once. Its call id HISTORY_REF
is no artifact's id, so that reference always opens it. A reader gets the lines its row
records (Task.read), never an append in progress.
"""

from __future__ import annotations

import bisect
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
"""The call id the history is stored under; not a plain file name, so no artifact id
equals it, and read_artifact and Task.artifact find the history by it."""


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
        """The artifact id of the history _data holds (None: no history yet)."""
        self._data = b""
        self._ends: list[int] = []
        """Where each line held ends (its byte offset after its "\n")."""
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
        known: list[int] = []
        for message in messages:
            line = _line(message)
            at = self._lines.get(_digest(line)) if skip_known else None
            if at is None:
                new.append(line)
            else:
                known.append(at)
        admitted = self._store(b"".join(new)) if new else self._stored()
        assert admitted.artifact is not None  # an offload always has one
        # Another process may have appended after our refresh: ours are the last len(new)
        # lines of the history as our append left it.
        end = bisect.bisect_right(self._ends, admitted.artifact.bytes)
        positions = known + list(range(end - len(new), end))
        return Span(min(positions, default=end), max(positions, default=0), admitted)

    def _refresh(self) -> None:
        """Follow the task's live history: another History (or process) may have
        appended since, and retention may have removed it."""
        latest = newest(self.task.artifacts(call_id=HISTORY_REF))
        if latest is None or latest.artifact_id != self._row:
            self._row, self._data, self._ends, self._lines = None, b"", [], {}
        if latest is not None and latest.bytes != len(self._data):
            data = self.task.read(latest, actor=HISTORY_TOOL)
            self._row = latest.artifact_id
            if not data.startswith(self._data):  # not grown from what we hold: start over
                self._data, self._ends, self._lines = b"", [], {}
            self._index(data[len(self._data) :])

    def _index(self, data: bytes) -> None:
        """Take data (whole lines) after what is held, remembering each line's position."""
        at = len(self._data)
        for line in data.splitlines(keepends=True):
            self._lines.setdefault(_digest(line), len(self._ends))
            at += len(line)
            self._ends.append(at)
        self._data += data

    def _store(self, data: bytes) -> Admitted:
        """Append data (whole lines) to the history; its notice as it now is."""
        admitted = self.task.append(ToolResult(HISTORY_REF, HISTORY_TOOL, data.decode("utf-8")))
        self._refresh()
        return admitted

    def _stored(self) -> Admitted:
        """The notice of the history as it is (nothing new to append)."""
        return self._store(b"")


_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
"""Characters JSON may leave raw that some line readers (str.splitlines, DuckDB's NDJSON
reader) take as a line's end: escaped, so a record is always one line to every reader."""


def _line(message: Mapping[str, Any]) -> bytes:
    """One message as one line of the history: JSON, readable unicode, escaped breaks (the
    same message to json.loads)."""
    return json.dumps(message, ensure_ascii=False).translate(_BREAKS).encode("utf-8") + b"\n"


def newest(rows: Sequence[ArtifactRow]) -> ArtifactRow | None:
    """The task's live history among its artifacts (oldest first); the newest, where a
    catalog from before appends in place still lists older copies."""
    return next((r for r in reversed(rows) if _is_history(r) and r.state == "live"), None)


def _is_history(row: ArtifactRow) -> bool:
    return row.origin == "append" and row.call_id == HISTORY_REF and row.tool == HISTORY_TOOL


def _digest(line: bytes) -> bytes:
    return hashlib.sha256(line.rstrip(b"\n")).digest()
