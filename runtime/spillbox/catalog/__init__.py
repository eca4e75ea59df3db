"""The catalog: tasks, artifacts and the access log, in SQLite in the spillbox home by
default, or in Postgres shared by several harness hosts (SPILLBOX_CATALOG_URL).

One schema and one migration history for both (SQLAlchemy Core, Alembic revisions in
migrations/versions/), applied once under a lock when a catalog is opened. A deleted
artifact keeps its row as a tombstone, so a later read says when and why it went. Garbage
collection claims its work (catalog/claims.py), so that two hosts never delete the same
thing.

    catalog = Catalog(Path("~/.spillbox").expanduser())        # <home>/catalog.sqlite3
    catalog = Catalog(home, url="postgresql://spillbox@db/spillbox")
    catalog.log("t1", "c1", "read", actor="read_artifact")
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Select, Table, bindparam, case, func, insert, or_, select, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import BindParameter

from spillbox.catalog import migrate
from spillbox.catalog.database import Database, Transaction, catalog_url, make_engine, sqlite_url
from spillbox.catalog.schema import (
    ACCESS_COLUMNS,
    ARTIFACT_COLUMNS,
    TASK_COLUMNS,
    access_log,
    artifacts,
    tasks,
)
from spillbox.catalog.schema import placements as placement_rows
from spillbox.errors import ConfigError
from spillbox.types import AccessEntry, ArtifactRow, TaskRow

if TYPE_CHECKING:
    from sqlalchemy.dialects import postgresql

__all__ = ["CATALOG_FILE", "DEFAULT_BUSY_TIMEOUT", "Action", "Catalog"]

CATALOG_FILE = "catalog.sqlite3"
DEFAULT_BUSY_TIMEOUT = 10.0
"""How long a writer waits for another process's lock before a clear error."""

Action = Literal[
    "offload",
    "redact",
    "read",
    "query",
    "export",
    "export_denied",
    "delete",
    "append",
    "pin",
    "unpin",
    "policy",
]

_KEY = (artifacts.c.task_id == bindparam("key_task")) & (
    artifacts.c.artifact_id == bindparam("key_artifact")
)
_LIVE = artifacts.c.state == "live"
_SELECT_TASK = select(*TASK_COLUMNS).where(tasks.c.task_id == bindparam("task_id"))
_SELECT_TASK_FOR_UPDATE = _SELECT_TASK.with_for_update()
_REOPEN_TASK = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"))
    .values(state="open", closed_at=None, delete_after=None, retention=bindparam("retention"))
)
_CLOSE_TASK = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"), tasks.c.state != "deleted")
    .values(
        state="closed",
        closed_at=func.coalesce(tasks.c.closed_at, bindparam("at")),
        delete_after=bindparam("delete_after"),
    )
)
_TASK_DELETED = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"))
    .values(state="deleted", deleted_at=bindparam("at"), deleted_by=bindparam("by"))
)
_SELECT_IDENTICAL = (
    select(*ARTIFACT_COLUMNS)
    .where(
        artifacts.c.task_id == bindparam("task_id"),
        artifacts.c.sha256 == bindparam("sha256"),
        artifacts.c.bytes == bindparam("bytes"),
        _LIVE,
        # An appendable artifact's bytes change: another payload never points at them.
        artifacts.c.origin != "append",
    )
    .order_by(artifacts.c.created_at)
    .limit(1)
)
_INSERT_LOG = insert(access_log)
_TOMBSTONE = (
    update(artifacts)
    .where(_KEY, _LIVE, artifacts.c.pinned == 0)
    .values(state="deleted", deleted_at=bindparam("at"), deleted_by=bindparam("by"))
)
_TOUCH = (
    update(artifacts)
    .where(_KEY)
    .values(
        last_access_at=bindparam("at"),
        expires_at=func.coalesce(bindparam("expires_at"), artifacts.c.expires_at),
    )
)
_PIN = update(artifacts).where(_KEY).values(pinned=bindparam("pinned"))
_LIST_ARTIFACTS = select(*ARTIFACT_COLUMNS).where(artifacts.c.task_id == bindparam("task_id"))
_ARTIFACT_ORDER = (artifacts.c.created_at, artifacts.c.artifact_id)
_LIST_LIVE = _LIST_ARTIFACTS.where(_LIVE).order_by(*_ARTIFACT_ORDER)
_LIST_ALL = _LIST_ARTIFACTS.order_by(*_ARTIFACT_ORDER)
_REF: BindParameter[str] = bindparam("ref")
_AS_CALL = or_(artifacts.c.origin == "call", artifacts.c.origin == "append") & (
    artifacts.c.call_id == _REF
)
_BY_REF = (
    _AS_CALL,
    artifacts.c.path == _REF,
    artifacts.c.artifact_id == _REF,
    artifacts.c.name == _REF,
    artifacts.c.name == bindparam("base"),
)
"""What a reference can be, in the order find() tries them."""
_FIND = (
    _LIST_ARTIFACTS.where(or_(*_BY_REF))
    .order_by(
        case(*((match, rule) for rule, match in enumerate(_BY_REF))),  # the first rule it meets
        _LIVE.desc(),
        artifacts.c.created_at.desc(),
    )
    .limit(1)
)
_ID_TAKEN = (
    select(artifacts.c.artifact_id)
    .where(artifacts.c.task_id == bindparam("task_id"), artifacts.c.artifact_id == _REF)
    .limit(1)
)


def _on_host(task_id: Any) -> Any:
    """The task is placed on the host named by the "host" parameter (a cluster's)."""
    # placement_rows: the package's name `placements` is its submodule's once imported.
    placed = select(placement_rows.c.task_id).where(
        placement_rows.c.host == bindparam("host"), placement_rows.c.state == "placed"
    )
    return task_id.in_(placed)


_SELECT_LOG = (
    select(*ACCESS_COLUMNS)
    .where(access_log.c.task_id == bindparam("task_id"))
    .order_by(access_log.c.id)
)
_CLAIMS = {"claimed_by": None, "claimed_until": None}
"""Claim columns of a row (re)written whole: nobody holds it."""


class Catalog:
    """The catalog of one spillbox home (SQLite), or of many hosts (Postgres).

    >>> catalog = Catalog(Path("/tmp/spillbox-doc"))
    >>> catalog.open_task("t1", "{}").state
    'open'
    """

    def __init__(
        self, home: Path, busy_timeout: float = DEFAULT_BUSY_TIMEOUT, url: str | None = None
    ) -> None:
        self.path: Path | None = None
        """The SQLite file (None on Postgres)."""
        self.busy_timeout = busy_timeout
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        """Who this catalog's collector claims work as."""
        if url is None:
            try:
                home.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(
                    f"cannot create the spillbox home {home}: {e.strerror}; "
                    "set --home / SPILLBOX_HOME to a writable folder"
                ) from e
            self.path = home / CATALOG_FILE
            address = sqlite_url(self.path)
            self.where = str(self.path)
        else:
            address = catalog_url(url)
            self.where = address.render_as_string(hide_password=True)
        self.engine = make_engine(address, busy_timeout)
        self.db = Database(self.engine, self.where, busy_timeout)
        """The statements' runner, also for the catalog's other modules (claims, calls)."""
        dialect = self.engine.dialect.name
        self._upsert_task = _upsert(dialect, tasks, ("task_id",))
        self._insert_artifact = _insert_new(dialect, artifacts, ("task_id", "artifact_id"))
        try:
            with self.db.errors("migrating the schema"):
                self.migrated = migrate.upgrade(self.engine, self.where)
                """Whether opening this catalog ran migrations (another process may have)."""
        except BaseException:
            self.engine.dispose()
            raise

    def close(self) -> None:
        self.db.close()

    def revision(self) -> str | None:
        """The schema's Alembic revision (migrate.head() once opened)."""
        with self.db.errors("reading the schema version"), self.engine.connect() as conn:
            return migrate.current(conn)

    # Tasks

    def task(self, task_id: str) -> TaskRow | None:
        rows = self.db.rows("reading a task", _SELECT_TASK, {"task_id": task_id})
        return TaskRow(**rows[0]) if rows else None

    def known_task(self, task_id: str, deleted_too: bool = False) -> TaskRow:
        """The task's row, or a ConfigError that says how to list the tasks there are.

        deleted_too: a deleted task counts as known (its tombstones and audit log stay)."""
        row = self.task(task_id)
        if row is None or (row.state == "deleted" and not deleted_too):
            raise ConfigError(f"no task {task_id!r}: see `spillbox tasks`")
        return row

    def tasks(
        self, states: Sequence[str] = ("open", "closed"), host: str | None = None
    ) -> list[TaskRow]:
        """The tasks in these states; host: only those placed on that cluster host."""
        statement = _list_tasks(tuple(states), host is not None)
        rows = self.db.rows("listing tasks", statement, _host(host))
        return [TaskRow(**row) for row in rows]

    def open_task(self, task_id: str, retention: str) -> TaskRow:
        """Register a task on first use; a later use with another policy records the change."""
        now = time.time()
        with self.db.transaction("opening a task") as tx:
            found = tx.rows(_SELECT_TASK_FOR_UPDATE, {"task_id": task_id})
            if not found or found[0]["state"] == "deleted":
                values = {
                    "task_id": task_id,
                    "created_at": now,
                    "closed_at": None,
                    "delete_after": None,
                    "retention": retention,
                    "state": "open",
                    "deleted_at": None,
                    "deleted_by": None,
                    **_CLAIMS,
                }
                tx.execute(self._upsert_task, values)
            else:
                tx.execute(_REOPEN_TASK, {"key_task": task_id, "retention": retention})
                if found[0]["retention"] != retention:
                    _log(tx, task_id, None, "policy", "harness", retention)
            [row] = tx.rows(_SELECT_TASK, {"task_id": task_id})
        return TaskRow(**row)

    def close_task(self, task_id: str, delete_after: float | None) -> None:
        """Close a task, or re-close a closed one with a new deadline (a removal that a
        pin held back clears it, so collection does not retry the removal on every run)."""
        args = {"key_task": task_id, "at": time.time(), "delete_after": delete_after}
        with self.db.transaction("closing a task") as tx:
            tx.execute(_CLOSE_TASK, args)

    def mark_task_deleted(self, task_id: str, by: str) -> None:
        args = {"key_task": task_id, "at": time.time(), "by": by}
        with self.db.transaction("deleting a task") as tx:
            tx.execute(_TASK_DELETED, args)

    # Artifacts

    def add_artifact(self, row: ArtifactRow, redacted: str | None = None) -> bool:
        """Record an artifact and its offload; `redacted` (replacements per kind, as JSON)
        logs, in the same transaction, that its payload was redacted before it was stored.

        False, writing nothing, if the task has an artifact of this id already, live or a
        tombstone: an id is one artifact's forever (a tombstone never comes back to life),
        and the caller gives the payload another (id_taken)."""
        values = {column.name: getattr(row, column.name) for column in ARTIFACT_COLUMNS}
        values["pinned"] = int(row.pinned)
        if row.tokens_exact is not None:
            values["tokens_exact"] = int(row.tokens_exact)
        with self.db.transaction("recording an artifact") as tx:
            if not tx.execute(self._insert_artifact, {**values, **_CLAIMS}):
                return False
            _log(tx, row.task_id, row.artifact_id, "offload", row.tool, row.call_id)
            if redacted is not None:
                _log(tx, row.task_id, row.artifact_id, "redact", "retention", redacted)
        return True

    def id_taken(self, task_id: str, artifact_id: str) -> bool:
        """Whether the task has (or had: tombstones count) an artifact of this id."""
        args = {"task_id": task_id, "ref": artifact_id}
        return bool(self.db.rows("checking an artifact id", _ID_TAKEN, args))

    def artifacts(self, task_id: str, include_deleted: bool = False) -> list[ArtifactRow]:
        statement = _LIST_ALL if include_deleted else _LIST_LIVE
        rows = self.db.rows("listing artifacts", statement, {"task_id": task_id})
        return [_artifact(row) for row in rows]

    def find(self, task_id: str, ref: str) -> ArtifactRow | None:
        """An artifact (or its tombstone) by reference, tried in this order, so that an id
        a model was given always means what it was given for:

        1. the call id of a tool call's result: the model's own id for that call (an output
           file named like a call id never stands in for the call's result);
        2. the path a notice or a script's files showed;
        3. the artifact id (never given to two artifacts, see add_artifact);
        4. the file name; 5. the file name at the end of a path written another way.

        Within a rule, a live artifact before a tombstone, then the newest (a call id a
        model used again)."""
        args = {"task_id": task_id, "ref": ref, "base": ref.rsplit("/", 1)[-1]}
        rows = self.db.rows("finding an artifact", _FIND, args)
        return _artifact(rows[0]) if rows else None

    def accessed(
        self,
        task_id: str,
        artifact_id: str,
        expires_at: float | None,
        action: Action,
        actor: str,
        detail: str = "",
    ) -> None:
        """Record a read or query of an artifact: its last access (and expiry, if given)
        and its line in the access log, in one transaction."""
        args = {
            "key_task": task_id,
            "key_artifact": artifact_id,
            "at": time.time(),
            "expires_at": expires_at,
        }
        with self.db.transaction("recording an access") as tx:
            tx.execute(_TOUCH, args)
            _log(tx, task_id, artifact_id, action, actor, detail)

    def set_pinned(self, task_id: str, artifact_id: str, pinned: bool, actor: str) -> None:
        args = {"key_task": task_id, "key_artifact": artifact_id, "pinned": int(pinned)}
        with self.db.transaction("pinning an artifact") as tx:
            tx.execute(_PIN, args)
            _log(tx, task_id, artifact_id, "pin" if pinned else "unpin", actor, "")

    def tombstone(self, task_id: str, artifact_id: str, by: str) -> bool:
        """Mark an artifact deleted, unless pinned; False if it was pinned or already gone
        (the one conditional update that two collectors cannot both win)."""
        args = {"key_task": task_id, "key_artifact": artifact_id, "at": time.time(), "by": by}
        with self.db.transaction("deleting an artifact") as tx:
            changed = tx.execute(_TOMBSTONE, args)
            if changed:
                _log(tx, task_id, artifact_id, "delete", "retention", by)
        return bool(changed)

    def identical(self, task_id: str, sha256: str, size: int) -> ArtifactRow | None:
        """A live artifact of the task with exactly these bytes (by digest and size)."""
        args = {"task_id": task_id, "sha256": sha256, "bytes": size}
        rows = self.db.rows("finding an identical artifact", _SELECT_IDENTICAL, args)
        return _artifact(rows[0]) if rows else None

    # The access log

    def log(
        self, task_id: str, artifact_id: str | None, action: Action, actor: str, detail: str = ""
    ) -> None:
        with self.db.transaction("writing the access log") as tx:
            _log(tx, task_id, artifact_id, action, actor, detail)

    def audit(self, task_id: str) -> list[AccessEntry]:
        rows = self.db.rows("reading the access log", _SELECT_LOG, {"task_id": task_id})
        return [AccessEntry(**row) for row in rows]


def _host(host: str | None) -> dict[str, str]:
    """The parameter of a statement scoped to one host (_on_host), if it is."""
    return {} if host is None else {"host": host}


@cache
def _list_tasks(states: tuple[str, ...], on_host: bool) -> Select[Any]:
    """The statement listing tasks in these states (one per set of states: each is
    compiled once); on_host: those placed on one host only."""
    # state = a OR state = b: plain parameters (IN (...) is expanded when executed, which
    # a statement compiled once for the driver cannot be).
    in_states = or_(*(tasks.c.state == state for state in states))
    where = (in_states, _on_host(tasks.c.task_id)) if on_host else (in_states,)
    return select(*TASK_COLUMNS).where(*where).order_by(tasks.c.task_id)


def _insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    """The dialect's INSERT, which has ON CONFLICT."""
    if dialect == "sqlite":
        return sqlite.insert(table)
    # Imported for a Postgres catalog only: the dialect (with its asyncpg and asyncio
    # modules) is a third of sqlalchemy's import, which a SQLite catalog need not pay.
    from sqlalchemy.dialects import postgresql

    return postgresql.insert(table)


def _upsert(dialect: str, table: Table, keys: Sequence[str]) -> Insert:
    """INSERT a whole row, or replace every column of the row with these keys."""
    statement = _insert(dialect, table)
    others = {c.name: statement.excluded[c.name] for c in table.columns if c.name not in keys}
    upsert: Insert = statement.on_conflict_do_update(index_elements=list(keys), set_=others)
    return upsert


def _insert_new(dialect: str, table: Table, keys: Sequence[str]) -> Insert:
    """INSERT a whole row, or nothing if a row with these keys exists (0 rows changed)."""
    statement = _insert(dialect, table)
    insert_new: Insert = statement.on_conflict_do_nothing(index_elements=list(keys))
    return insert_new


def _log(
    tx: Transaction,
    task_id: str,
    artifact_id: str | None,
    action: Action,
    actor: str,
    detail: str,
) -> None:
    tx.execute(
        _INSERT_LOG,
        {
            "task_id": task_id,
            "artifact_id": artifact_id,
            "action": action,
            "at": time.time(),
            "actor": actor,
            "detail": detail,
        },
    )


def _artifact(row: dict[str, Any]) -> ArtifactRow:
    row["pinned"] = bool(row["pinned"])
    if row["tokens_exact"] is not None:
        row["tokens_exact"] = bool(row["tokens_exact"])
    return ArtifactRow(**row)
