"""Call ids that no process on a catalog gives out twice: a counter per task and tool (the
call_numbers table), moved on in the write transaction that hands out the id.

    next_call_id(catalog, "t1", "git_log")   # "git_log_1", then "git_log_2", ...
"""

from __future__ import annotations

from functools import cache

from sqlalchemy import bindparam, select
from sqlalchemy.sql.dml import Insert

from spillbox.catalog import _AS_CALL, Catalog, _insert
from spillbox.catalog.schema import artifacts, call_numbers

_CALL_ID_USED = (
    select(artifacts.c.artifact_id)
    .where(artifacts.c.task_id == bindparam("task_id"), _AS_CALL)
    .limit(1)
)


def next_call_id(catalog: Catalog, task_id: str, tool: str) -> str:
    """An id for the task's next call of tool, <tool>_<n>, that no process on this catalog
    has given out or will give again (the counter's row is taken in the write
    transaction). A number whose id an artifact already has as its call id (a proxy from
    before the counter, a harness whose model chose it) is passed over."""
    args = {"task_id": task_id, "tool": tool, "last": 1}
    numbered = _numbered(catalog.engine.dialect.name)
    with catalog.db.transaction("numbering a call") as tx:
        while True:
            [row] = tx.rows(numbered, args)
            call_id = f"{tool}_{row['last']}"
            if not tx.rows(_CALL_ID_USED, {"task_id": task_id, "ref": call_id}):
                return call_id


@cache
def _numbered(dialect: str) -> Insert:
    """INSERT a task's first number for a tool, or add one to the last: the number either
    way (RETURNING, on SQLite as on Postgres)."""
    statement = _insert(dialect, call_numbers)
    numbered: Insert = statement.on_conflict_do_update(
        index_elements=["task_id", "tool"], set_={"last": call_numbers.c.last + 1}
    ).returning(call_numbers.c.last)
    return numbered
