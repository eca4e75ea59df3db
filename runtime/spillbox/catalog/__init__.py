"""The catalog: tasks, artifacts and the access log, in SQLite in the spillbox home.

WAL mode and a busy timeout make it safe for several harness processes on one home;
schema changes go through numbered migrations recorded in the database. A deleted
artifact keeps its row as a tombstone, so a later read says when and why it went.

    catalog = Catalog(Path("~/.spillbox").expanduser())
    catalog.log("t1", "c1", "read", actor="read_artifact")
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from spillbox.errors import ConfigError, StorageError
from spillbox.types import AccessEntry, ArtifactRow, TaskRow

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
    "pin",
    "unpin",
    "policy",
]

Migration = Callable[[sqlite3.Connection], None]
"""One schema change, run inside the migrating transaction."""


def create_tasks_artifacts_and_access_log(conn: sqlite3.Connection) -> None:
    """Tasks, artifacts (rows stay as tombstones), and the access log."""
    conn.execute(
        """
        CREATE TABLE tasks (
            task_id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            closed_at REAL,
            delete_after REAL,
            retention TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed', 'deleted')),
            deleted_at REAL,
            deleted_by TEXT
        )
        """
    )
    conn.execute(
        """
        CREATE TABLE artifacts (
            task_id TEXT NOT NULL REFERENCES tasks(task_id),
            artifact_id TEXT NOT NULL,
            call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            name TEXT NOT NULL,
            path TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            tokens INTEGER,
            tokens_exact INTEGER,
            sha256 TEXT NOT NULL,
            created_at REAL NOT NULL,
            last_access_at REAL NOT NULL,
            expires_at REAL,
            state TEXT NOT NULL DEFAULT 'live' CHECK (state IN ('live', 'deleted')),
            pinned INTEGER NOT NULL DEFAULT 0,
            redactions INTEGER NOT NULL DEFAULT 0,
            deleted_at REAL,
            deleted_by TEXT,
            PRIMARY KEY (task_id, artifact_id)
        )
        """
    )
    conn.execute("CREATE INDEX artifacts_by_expiry ON artifacts(state, expires_at)")
    conn.execute("CREATE INDEX artifacts_by_call ON artifacts(task_id, call_id)")
    conn.execute(
        """
        CREATE TABLE access_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            task_id TEXT NOT NULL,
            artifact_id TEXT,
            action TEXT NOT NULL,
            at REAL NOT NULL,
            actor TEXT NOT NULL,
            detail TEXT NOT NULL DEFAULT ''
        )
        """
    )
    conn.execute("CREATE INDEX access_log_by_task ON access_log(task_id, id)")


def index_artifacts_by_digest(conn: sqlite3.Connection) -> None:
    """Finding the stored copy of the same bytes without scanning every artifact of a task."""
    conn.execute("CREATE INDEX artifacts_by_digest ON artifacts(task_id, sha256)")


def record_artifact_kind(conn: sqlite3.Connection) -> None:
    """Each artifact's shape kind as the profile found it, so that a reader pages it by its
    shape rather than by guessing from its file extension (older rows: NULL)."""
    conn.execute("ALTER TABLE artifacts ADD COLUMN kind TEXT")


MIGRATIONS: Sequence[Migration] = (
    create_tasks_artifacts_and_access_log,
    index_artifacts_by_digest,
    record_artifact_kind,
)
"""Applied in order, each once, and recorded in schema_migrations by name (and number)."""


class Catalog:
    """The SQLite catalog of one spillbox home; one connection per thread."""

    def __init__(self, home: Path, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> None:
        self.path = home / CATALOG_FILE
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"cannot create the spillbox home {home}: {e.strerror}; "
                "set --home / SPILLBOX_HOME to a writable folder"
            ) from e
        self._migrate()

    def _connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            with self._errors("opening"):
                conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
                conn.row_factory = sqlite3.Row
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA foreign_keys=ON")
                conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def close(self) -> None:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Translate sqlite3's exceptions into one-line StorageErrors."""
        try:
            yield
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise StorageError(
                    f"the catalog {self.path} stayed locked by another process for "
                    f"{self.busy_timeout:g} s while {doing}; retry, or find the stuck process"
                ) from e
            raise StorageError(f"the catalog {self.path} failed while {doing}: {e}") from e
        except sqlite3.IntegrityError as e:
            raise StorageError(
                f"the catalog {self.path} refused a record ({e}) while {doing}: nothing was "
                "written; this is a spillbox bug, please report it with this line"
            ) from e
        except sqlite3.DatabaseError as e:
            raise StorageError(
                f"the catalog {self.path} is damaged ({e}) while {doing}: "
                "restore it from a backup or move it aside"
            ) from e

    @contextmanager
    def transaction(self, doing: str) -> Iterator[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE: take the write lock up front)."""
        conn = self._connection()
        with self._errors(doing):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _query(self, doing: str, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._errors(doing):
            return self._connection().execute(sql, args).fetchall()

    def _migrate(self) -> None:
        with self.transaction("migrating the schema") as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, applied_at REAL NOT NULL, name TEXT)"
            )
            columns = {row[1] for row in conn.execute("PRAGMA table_info(schema_migrations)")}
            if "name" not in columns:  # a catalog from before migrations were named
                conn.execute("ALTER TABLE schema_migrations ADD COLUMN name TEXT")
                for version, migration in enumerate(MIGRATIONS, start=1):
                    conn.execute(
                        "UPDATE schema_migrations SET name = ? WHERE version = ?",
                        (migration.__name__, version),
                    )
            done = dict(conn.execute("SELECT name, version FROM schema_migrations").fetchall())
            known = {migration.__name__ for migration in MIGRATIONS}
            unknown = [str(name) for name in done if name not in known]
            if unknown or (done and max(done.values()) > len(MIGRATIONS)):
                newest = max(done.values())
                raise ConfigError(
                    f"the catalog {self.path} has schema version {newest}, newer than this "
                    f"spillbox knows ({len(MIGRATIONS)}): upgrade spillbox"
                )
            for version, migration in enumerate(MIGRATIONS, start=1):
                if migration.__name__ in done:
                    continue
                migration(conn)
                conn.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                    (version, time.time(), migration.__name__),
                )

    def schema_version(self) -> int:
        rows = self._query(
            "reading the schema version", "SELECT max(version) FROM schema_migrations"
        )
        return int(rows[0][0] or 0)

    # Tasks

    def task(self, task_id: str) -> TaskRow | None:
        rows = self._query("reading a task", "SELECT * FROM tasks WHERE task_id = ?", (task_id,))
        return TaskRow(**dict(rows[0])) if rows else None

    def known_task(self, task_id: str, deleted_too: bool = False) -> TaskRow:
        """The task's row, or a ConfigError that says how to list the tasks there are.

        deleted_too: a deleted task counts as known (its tombstones and audit log stay)."""
        row = self.task(task_id)
        if row is None or (row.state == "deleted" and not deleted_too):
            raise ConfigError(f"no task {task_id!r}: see `spillbox tasks`")
        return row

    def tasks(self, states: Sequence[str] = ("open", "closed")) -> list[TaskRow]:
        marks = ",".join("?" * len(states))
        rows = self._query(
            "listing tasks",
            f"SELECT * FROM tasks WHERE state IN ({marks}) ORDER BY task_id",
            states,
        )
        return [TaskRow(**dict(row)) for row in rows]

    def open_task(self, task_id: str, retention: str) -> TaskRow:
        """Register a task on first use; a later use with another policy records the change."""
        now = time.time()
        with self.transaction("opening a task") as conn:
            row = conn.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if row is None or row["state"] == "deleted":
                conn.execute(
                    "INSERT OR REPLACE INTO tasks (task_id, created_at, retention, state) "
                    "VALUES (?, ?, ?, 'open')",
                    (task_id, now, retention),
                )
            else:
                conn.execute(
                    "UPDATE tasks SET state = 'open', closed_at = NULL, delete_after = NULL "
                    "WHERE task_id = ?",
                    (task_id,),
                )
                if row["retention"] != retention:
                    conn.execute(
                        "UPDATE tasks SET retention = ? WHERE task_id = ?", (retention, task_id)
                    )
                    _log(conn, task_id, None, "policy", "harness", retention)
        found = self.task(task_id)
        assert found is not None
        return found

    def close_task(self, task_id: str, delete_after: float | None) -> None:
        """Close a task, or re-close a closed one with a new deadline (a removal that a
        pin held back clears it, so collection does not retry the removal on every run)."""
        with self.transaction("closing a task") as conn:
            conn.execute(
                "UPDATE tasks SET state = 'closed', closed_at = COALESCE(closed_at, ?), "
                "delete_after = ? WHERE task_id = ? AND state IN ('open', 'closed')",
                (time.time(), delete_after, task_id),
            )

    def mark_task_deleted(self, task_id: str, by: str) -> None:
        with self.transaction("deleting a task") as conn:
            conn.execute(
                "UPDATE tasks SET state = 'deleted', deleted_at = ?, deleted_by = ? "
                "WHERE task_id = ?",
                (time.time(), by, task_id),
            )

    # Artifacts

    def add_artifact(self, row: ArtifactRow, redacted: str | None = None) -> None:
        """Record an artifact and its offload; `redacted` (replacements per kind, as JSON)
        logs, in the same transaction, that its payload was redacted before it was stored."""
        with self.transaction("recording an artifact") as conn:
            conn.execute(
                "INSERT OR REPLACE INTO artifacts VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.task_id, row.artifact_id, row.call_id, row.tool, row.name, row.path,
                    row.bytes, row.tokens, row.tokens_exact, row.sha256, row.created_at,
                    row.last_access_at, row.expires_at, row.state, row.pinned, row.redactions,
                    row.deleted_at, row.deleted_by, row.kind,
                ),
            )  # fmt: skip
            _log(conn, row.task_id, row.artifact_id, "offload", row.tool, row.call_id)
            if redacted is not None:
                _log(conn, row.task_id, row.artifact_id, "redact", "retention", redacted)

    def artifacts(self, task_id: str, include_deleted: bool = False) -> list[ArtifactRow]:
        only_live = "" if include_deleted else " AND state = 'live'"
        rows = self._query(
            "listing artifacts",
            f"SELECT * FROM artifacts WHERE task_id = ?{only_live} ORDER BY created_at, rowid",
            (task_id,),
        )
        return [_artifact(row) for row in rows]

    def find(self, task_id: str, ref: str) -> ArtifactRow | None:
        """An artifact (or its tombstone) by artifact id, file name, or the call id it came from."""
        rows = self._query(
            "finding an artifact",
            "SELECT * FROM artifacts WHERE task_id = ? AND (artifact_id = ? OR name = ? OR "
            "call_id = ?) ORDER BY state = 'live' DESC, artifact_id = ? DESC, created_at DESC",
            (task_id, ref, ref, ref, ref),
        )
        return _artifact(rows[0]) if rows else None

    def touch(self, task_id: str, artifact_id: str, expires_at: float | None) -> None:
        with self.transaction("recording an access") as conn:
            conn.execute(
                "UPDATE artifacts SET last_access_at = ?, expires_at = COALESCE(?, expires_at) "
                "WHERE task_id = ? AND artifact_id = ?",
                (time.time(), expires_at, task_id, artifact_id),
            )

    def set_pinned(self, task_id: str, artifact_id: str, pinned: bool, actor: str) -> None:
        with self.transaction("pinning an artifact") as conn:
            conn.execute(
                "UPDATE artifacts SET pinned = ? WHERE task_id = ? AND artifact_id = ?",
                (int(pinned), task_id, artifact_id),
            )
            _log(conn, task_id, artifact_id, "pin" if pinned else "unpin", actor, "")

    def tombstone(self, task_id: str, artifact_id: str, by: str) -> bool:
        """Mark an artifact deleted, unless pinned; False if it was pinned or already gone."""
        with self.transaction("deleting an artifact") as conn:
            changed = conn.execute(
                "UPDATE artifacts SET state = 'deleted', deleted_at = ?, deleted_by = ? "
                "WHERE task_id = ? AND artifact_id = ? AND state = 'live' AND pinned = 0",
                (time.time(), by, task_id, artifact_id),
            ).rowcount
            if changed:
                _log(conn, task_id, artifact_id, "delete", "retention", by)
        return bool(changed)

    def identical(self, task_id: str, sha256: str, size: int) -> ArtifactRow | None:
        """A live artifact of the task with exactly these bytes (by digest and size)."""
        rows = self._query(
            "finding an identical artifact",
            "SELECT * FROM artifacts WHERE task_id = ? AND sha256 = ? AND bytes = ? "
            "AND state = 'live' ORDER BY created_at LIMIT 1",
            (task_id, sha256, size),
        )
        return _artifact(rows[0]) if rows else None

    def expired(self, now: float) -> list[ArtifactRow]:
        rows = self._query(
            "finding expired artifacts",
            "SELECT * FROM artifacts WHERE state = 'live' AND pinned = 0 "
            "AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at",
            (now,),
        )
        return [_artifact(row) for row in rows]

    # The access log

    def log(
        self, task_id: str, artifact_id: str | None, action: Action, actor: str, detail: str = ""
    ) -> None:
        with self.transaction("writing the access log") as conn:
            _log(conn, task_id, artifact_id, action, actor, detail)

    def audit(self, task_id: str) -> list[AccessEntry]:
        rows = self._query(
            "reading the access log",
            "SELECT * FROM access_log WHERE task_id = ? ORDER BY id",
            (task_id,),
        )
        return [AccessEntry(**dict(row)) for row in rows]


def _log(
    conn: sqlite3.Connection,
    task_id: str,
    artifact_id: str | None,
    action: Action,
    actor: str,
    detail: str,
) -> None:
    conn.execute(
        "INSERT INTO access_log (task_id, artifact_id, action, at, actor, detail) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        (task_id, artifact_id, action, time.time(), actor, detail),
    )


def _artifact(row: sqlite3.Row) -> ArtifactRow:
    data = dict(row)
    data["pinned"] = bool(data["pinned"])
    if data["tokens_exact"] is not None:
        data["tokens_exact"] = bool(data["tokens_exact"])
    return ArtifactRow(**data)
