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
import re
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from spillbox.catalog import migrate
from spillbox.catalog.database import (
    Database,
    Statement,
    Transaction,
    catalog_url,
)
from spillbox.errors import ConfigError
from spillbox.types import AccessEntry, ArtifactRow, TaskRow

if TYPE_CHECKING:
    from sqlalchemy import Engine

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

# The statements (catalog/statements.py), by name
_SELECT_TASK = Statement("select_task")
_SELECT_TASK_FOR_UPDATE = Statement("select_task_for_update")
_REOPEN_TASK = Statement("reopen_task")
_UPSERT_TASK = Statement("upsert_task", insert=True)
_CLOSE_TASK = Statement("close_task")
_TASK_DELETED = Statement("task_deleted")
_INSERT_ARTIFACT = Statement("insert_artifact", insert=True)
_SELECT_IDENTICAL = Statement("select_identical")
_INSERT_LOG = Statement("insert_log", insert=True)
_TOMBSTONE = Statement("tombstone")
_TOUCH = Statement("touch")
_PIN = Statement("pin")
_FIND = Statement("find")
_SELECT_ARTIFACT = Statement("select_artifact")
_UNSENDABLE = re.compile(r"[\x00\ud800-\udfff]")
"""What no catalog's text parameter can hold: a NUL (Postgres), a lone surrogate (UTF-8)."""
_SELECT_LOG = Statement("select_log")
_CLAIMS = {"claimed_by": None, "claimed_until": None}
"""Claim columns of a row (re)written whole: nobody holds it."""


class Catalog:
    """The catalog of one spillbox home (SQLite), or of many hosts (Postgres).

    >>> catalog = Catalog(Path("/tmp/spillbox-doc"))
    >>> catalog.open_task("t1", "{}").state
    'open'
    """

    def __init__(
        self,
        home: Path,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        url: str | None = None,
        migrate_apart: bool = False,
    ) -> None:
        """migrate_apart: a schema that is not the newest is migrated in a child process
        (see migrate.upgrade), for a long-lived server."""
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
            self.where = str(self.path)
            self.db = Database(self.where, busy_timeout, sqlite=self.path)
        else:
            address = catalog_url(url)
            self.where = address.render_as_string(hide_password=True)
            if address.get_backend_name() == "sqlite":
                assert address.database is not None  # catalog_url refuses a URL without
                self.db = Database(self.where, busy_timeout, sqlite=Path(address.database))
            else:
                self.db = Database(self.where, busy_timeout, url=address)
        """The statements' runner, also for the catalog's other modules (claims, calls)."""
        try:
            with self.db.errors("migrating the schema"):
                apart = (home, url) if migrate_apart else None
                self.migrated = migrate.upgrade(self.db, apart)
                """Whether opening this catalog ran migrations (another process may have)."""
        except BaseException:
            self.db.close()
            raise

    @property
    def engine(self) -> Engine:
        """The catalog's SQLAlchemy engine (for migrations, and tests that look inside)."""
        return self.db.engine

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
        statement = Statement("list_tasks", (tuple(states), host is not None))
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
                tx.execute(_UPSERT_TASK, values)
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

        True once the row is recorded: by this call, or by an earlier one of this very row
        (on Postgres a write whose answer was lost with its connection is sent again, see
        Database.rows). False, writing nothing, if the task has another artifact of this
        id, live or a tombstone: an id is one artifact's forever (a tombstone never comes
        back to life), and the caller gives the payload another (id_taken)."""
        values = {field.name: getattr(row, field.name) for field in fields(ArtifactRow)}
        values = {**values, **_CLAIMS, "pinned": int(row.pinned)}
        if row.tokens_exact is not None:
            values["tokens_exact"] = int(row.tokens_exact)
        if self.db.sqlite is None:
            # The row and its log lines in one statement: one round trip, not four.
            statement = Statement("record_artifact", (redacted is not None,), insert=True)
            args = values if redacted is None else {**values, "redacted": redacted}
            if self.db.rows("recording an artifact", statement, args):
                return True
        else:
            with self.db.transaction("recording an artifact") as tx:
                if tx.execute(_INSERT_ARTIFACT, values):
                    _log(tx, row.task_id, row.artifact_id, "offload", row.tool, row.call_id)
                    if redacted is not None:
                        _log(tx, row.task_id, row.artifact_id, "redact", "retention", redacted)
                    return True
        args = {"task_id": row.task_id, "ref": row.artifact_id}
        found = self.db.rows("checking an artifact id", _SELECT_ARTIFACT, args)
        return bool(found) and _artifact(found[0]) == row

    def id_taken(self, task_id: str, artifact_id: str) -> bool:
        """Whether the task has (or had: tombstones count) an artifact of this id."""
        args = {"task_id": task_id, "ref": artifact_id}
        return bool(self.db.rows("checking an artifact id", _SELECT_ARTIFACT, args))

    def artifacts(
        self,
        task_id: str,
        include_deleted: bool = False,
        named_in: str | None = None,
        call_id: str | None = None,
    ) -> list[ArtifactRow]:
        """The task's artifacts, oldest first (with tombstones if asked); named_in: only
        those whose id or file name occurs in that text (a script that names them); call_id:
        only those of that call. Found by the database, however many the task has."""
        args: dict[str, Any] = {"task_id": task_id}
        if named_in is not None:
            # A NUL or a lone surrogate cannot be sent (and is in no id or name).
            args["text"] = _UNSENDABLE.sub("\ufffd", named_in)
        if call_id is not None:
            args["call_id"] = call_id
        options = (include_deleted, named_in is not None, call_id is not None)
        rows = self.db.rows("listing artifacts", Statement("list_artifacts", options), args)
        return [_artifact(row) for row in rows]

    def usage(self, task_id: str, other_than: str | None = None) -> tuple[int, int]:
        """How many live artifacts the task has and their bytes (other_than: leave that
        artifact out): what a quota is checked against, counted by the database."""
        statement = Statement("usage", (other_than is not None,))
        args = {"task_id": task_id, "ref": other_than}
        [row] = self.db.rows("counting a task's artifacts", statement, args)
        count, used = row.values()
        return int(count), int(used)

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
        artifact_ids: Sequence[str],
        expires_at: float | None,
        action: Action,
        actor: str,
        detail: str = "",
    ) -> None:
        """Record a read or query of artifacts: each one's last access (and expiry, if
        given) and its line in the access log, in one transaction (one round trip)."""
        writes: list[tuple[Statement, Mapping[str, Any]]] = []
        at = time.time()
        for artifact_id in artifact_ids:
            key = {"key_task": task_id, "key_artifact": artifact_id}
            writes.append((_TOUCH, {**key, "at": at, "expires_at": expires_at}))
            writes.append(_log_entry(task_id, artifact_id, action, actor, detail))
        if writes:
            self.db.batch("recording an access", writes)

    def set_pinned(self, task_id: str, artifact_id: str, pinned: bool, actor: str) -> None:
        args = {"key_task": task_id, "key_artifact": artifact_id, "pinned": int(pinned)}
        logged = _log_entry(task_id, artifact_id, "pin" if pinned else "unpin", actor, "")
        self.db.batch("pinning an artifact", [(_PIN, args), logged])

    def tombstone(self, task_id: str, artifact_id: str, by: str) -> bool:
        """Mark an artifact deleted, unless pinned; False if it was pinned or already gone
        (the one conditional update that two collectors cannot both win)."""
        args = {"key_task": task_id, "key_artifact": artifact_id, "at": time.time(), "by": by}
        with self.db.transaction("deleting an artifact") as tx:
            changed = tx.execute(_TOMBSTONE, args)
            if changed:
                _log(tx, task_id, artifact_id, "delete", "retention", by)
        return bool(changed)

    def identical(
        self, task_id: str, sha256: str, size: int, artifact_id: str
    ) -> tuple[ArtifactRow | None, bool]:
        """The task's oldest live artifact with exactly these bytes (by digest and size),
        and whether artifact_id is taken (as id_taken says): what storing a payload asks
        first, in one read."""
        args = {"task_id": task_id, "sha256": sha256, "bytes": size, "ref": artifact_id}
        rows = self.db.rows("finding an identical artifact", _SELECT_IDENTICAL, args)
        taken = any(row["artifact_id"] == artifact_id for row in rows)
        same = next((row for row in rows if row.pop("identical")), None)
        return (None if same is None else _artifact(same)), taken

    # The access log

    def log(
        self, task_id: str, artifact_id: str | None, action: Action, actor: str, detail: str = ""
    ) -> None:
        self.db.batch(
            "writing the access log", [_log_entry(task_id, artifact_id, action, actor, detail)]
        )

    def audit(self, task_id: str) -> list[AccessEntry]:
        rows = self.db.rows("reading the access log", _SELECT_LOG, {"task_id": task_id})
        return [AccessEntry(**row) for row in rows]


def _host(host: str | None) -> dict[str, str]:
    """The parameter of a statement scoped to one host (_on_host), if it is."""
    return {} if host is None else {"host": host}


def _log(
    tx: Transaction,
    task_id: str,
    artifact_id: str | None,
    action: Action,
    actor: str,
    detail: str,
) -> None:
    tx.execute(*_log_entry(task_id, artifact_id, action, actor, detail))


def _log_entry(
    task_id: str, artifact_id: str | None, action: Action, actor: str, detail: str
) -> tuple[Statement, dict[str, Any]]:
    """The statement that writes one line of the access log, with its parameters."""
    values = {
        "task_id": task_id,
        "artifact_id": artifact_id,
        "action": action,
        "at": time.time(),
        "actor": actor,
        "detail": detail,
    }
    return _INSERT_LOG, values


def _artifact(row: dict[str, Any]) -> ArtifactRow:
    row["pinned"] = bool(row["pinned"])
    if row["tokens_exact"] is not None:
        row["tokens_exact"] = bool(row["tokens_exact"])
    return ArtifactRow(**row)
