"""A task's history: every archived turn in one NDJSON artifact, appended to.

The fallback compaction archives the turns it moves out of a request here, and the loop
records every turn here when asked (run(..., record_turns=True)): one JSON message a line,
so one SQL table (SELECT role, count(*) FROM "spillbox-history") and one file for grep hold
every earlier turn, and search_artifacts finds any of them.

    history = History(task)
    span = history.append(messages)   # span.first..span.last: their lines in the history
    span.admitted.text                # the notice of the history as it now is

An artifact is stored whole under its sha256, so appending stores the history again with
the new lines after the old ones (its bytes begin with the previous copy's, byte for byte)
and then deletes the copy it replaces: one live history per task, never a chain of them.
Every copy has the call id HISTORY_REF, so that reference always opens the live one; its
line positions never change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spillbox.errors import SpillboxError
from spillbox.types import ToolResult

if TYPE_CHECKING:
    from spillbox.protocols import TaskHandle
    from spillbox.types import Admitted

HISTORY_TOOL = "spillbox_history"
"""The tool name the task's history is stored under (list_artifacts shows it)."""
HISTORY_REF = "spillbox-history"
"""The call id every copy of the history is stored under: read_artifact, search_artifacts
and Task.artifact find the live copy by it, whichever artifact id that copy has."""


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
            line = json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n"
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
        rows = [r for r in self.task.artifacts() if r.tool == HISTORY_TOOL]
        latest = rows[-1].artifact_id if rows else None
        if latest != self._row:
            self._row, self._data, self._count, self._lines = latest, b"", 0, {}
            self._index(self.task.read(rows[-1], actor=HISTORY_TOOL) if rows else b"")

    def _index(self, data: bytes) -> None:
        """Take data (whole lines) after what is held, remembering each line's position."""
        for line in data.splitlines(keepends=True):
            self._lines.setdefault(_digest(line), self._count)
            self._count += 1
        self._data += data

    def _store(self, data: bytes) -> Admitted:
        """Store data as the history (the same bytes again: the stored copy's notice) and
        delete the copy it replaces."""
        admitted = self.task.offload(ToolResult(HISTORY_REF, HISTORY_TOOL, data.decode("utf-8")))
        assert admitted.artifact is not None  # an offload always stores
        previous, self._row = self._row, admitted.artifact.id
        self._index(data[len(self._data) :])
        if previous is not None and previous != self._row:
            try:
                # The new copy holds every byte of this one: nothing is lost.
                self.task.delete(previous, by="compaction")
            except SpillboxError:
                pass  # pinned (legal hold) or already gone: it stays as retention says
        return admitted


def _digest(line: bytes) -> bytes:
    return hashlib.sha256(line.rstrip(b"\n")).digest()
