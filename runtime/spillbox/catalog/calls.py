"""Call ids that no process on a catalog gives out twice: a counter per task and tool (the
call_numbers table), moved on in the write transaction that hands out the id.

    next_call_id(catalog, "t1", "git_log")   # "git_log_1", then "git_log_2", ...
"""

from __future__ import annotations

from spillbox.catalog import Catalog
from spillbox.catalog.database import Statement

_NUMBERED = Statement("numbered_call", insert=True)
_CALL_ID_USED = Statement("call_id_used")


def next_call_id(catalog: Catalog, task_id: str, tool: str) -> str:
    """An id for the task's next call of tool, <tool>_<n>, that no process on this catalog
    has given out or will give again (the counter's row is taken in the write
    transaction). A number whose id an artifact already has as its call id (a proxy from
    before the counter, a harness whose model chose it) is passed over."""
    args = {"task_id": task_id, "tool": tool, "last": 1}
    with catalog.db.transaction("numbering a call") as tx:
        while True:
            [row] = tx.rows(_NUMBERED, args)
            call_id = f"{tool}_{row['last']}"
            if not tx.rows(_CALL_ID_USED, {"task_id": task_id, "ref": call_id}):
                return call_id
