"""Call ids that no process on a catalog gives out twice: a counter per task and tool (the
call_numbers table), moved on in the write transaction that hands out the ids.

    next_call_id(catalog, "t1", "git_log")   # "git_log_1", then "git_log_2", ...
    reserve_call_ids(catalog, "t1", "git_log", 4)   # the next four at once
"""

from __future__ import annotations

import threading
from collections import deque

from spillbox.catalog import Catalog
from spillbox.catalog.database import Statement

_NUMBERED = Statement("numbered_call", insert=True)
_CALL_ID_USED = Statement("call_id_used")


def next_call_id(catalog: Catalog, task_id: str, tool: str) -> str:
    """An id for the task's next call of tool, <tool>_<n>, that no process on this catalog
    has given out or will give again."""
    while True:
        reserved = reserve_call_ids(catalog, task_id, tool, 1)
        if reserved:
            return reserved[0]


def reserve_call_ids(catalog: Catalog, task_id: str, tool: str, count: int) -> list[str]:
    """The ids of the task's next count numbers for tool, taken in one write transaction
    (no other process gets them), in order. A number whose id an artifact already has as
    its call id (a proxy from before the counter, a harness whose model chose it) is
    passed over: fewer than count may come back, none if all were."""
    args = {"task_id": task_id, "tool": tool, "last": count}
    with catalog.db.transaction("numbering calls") as tx:
        [row] = tx.rows(_NUMBERED, args)
        ids = [f"{tool}_{n}" for n in range(row["last"] - count + 1, row["last"] + 1)]
        return [i for i in ids if not tx.rows(_CALL_ID_USED, {"task_id": task_id, "ref": i})]


class CallIds:
    """One process's call ids for one task, reserved from the catalog in blocks per tool:
    1 number at a tool's first call, then 2, 4, ... up to BLOCK_MAX, so that most calls
    are numbered without a catalog write (a write per call cost an MCP proxy about 0.1 ms
    of each pass-through call, benchmarks/mcp_bench.py). Ids stay unique on the catalog;
    numbers a process reserved and never used are skipped by the others (at most
    BLOCK_MAX - 1 per tool and process).

    >>> ids = CallIds(catalog, "t1")  # doctest: +SKIP
    >>> ids.ready("git_log"), ids.next("git_log"), ids.ready("git_log")  # doctest: +SKIP
    (None, 'git_log_1', None)
    """

    BLOCK_MAX = 16

    def __init__(self, catalog: Catalog, task_id: str) -> None:
        self.catalog = catalog
        self.task_id = task_id
        self._lock = threading.Lock()
        self._reserving = threading.Lock()
        """Held across a reservation: this process's ids come in the order reserved."""
        self._ready: dict[str, deque[str]] = {}
        self._block: dict[str, int] = {}

    def ready(self, tool: str) -> str | None:
        """The tool's next id if one is reserved already (no catalog access), else None."""
        with self._lock:
            ids = self._ready.get(tool)
            return ids.popleft() if ids else None

    def next(self, tool: str) -> str:
        """The tool's next id, reserving the next block in a catalog write if none is left."""
        with self._reserving:
            while (found := self.ready(tool)) is None:
                size = self._block[tool] = min(2 * self._block.get(tool, 0) or 1, self.BLOCK_MAX)
                ids = reserve_call_ids(self.catalog, self.task_id, tool, size)
                with self._lock:
                    self._ready.setdefault(tool, deque()).extend(ids)
        return found
