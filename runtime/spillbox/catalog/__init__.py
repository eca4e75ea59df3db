"""The catalog: tasks, artifacts and the access log, in SQLite in the spillbox home by
default, or in Postgres shared by several harness hosts (SPILLBOX_CATALOG_URL).

One schema and one migration history for both (SQLAlchemy Core, Alembic revisions in
migrations/versions/), applied once under a lock when a catalog is opened. A deleted
artifact keeps its row as a tombstone, so a later read says when and why it went. Garbage
collection claims its work (claim_expired, claim_task), so that two hosts never delete the
same thing.

    catalog = Catalog(Path("~/.spillbox").expanduser())        # <home>/catalog.sqlite3
    catalog = Catalog(home, url="postgresql://spillbox@db/spillbox")
    catalog.log("t1", "c1", "read", actor="read_artifact")
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Connection, Row, bindparam, func, insert, or_, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert

from spillbox.catalog import migrate
from spillbox.catalog.database import (
    WRITE,
    catalog_url,
    make_engine,
    sqlite_url,
    translated,
)
from spillbox.catalog.schema import (
    ACCESS_COLUMNS,
    ARTIFACT_COLUMNS,
    TASK_COLUMNS,
    access_log,
    artifacts,
    tasks,
)
from spillbox.errors import ConfigError
from spillbox.types import AccessEntry, ArtifactRow, TaskRow

__all__ = ["CATALOG_FILE", "DEFAULT_BUSY_TIMEOUT", "DEFAULT_CLAIM_LEASE", "Action", "Catalog"]

CATALOG_FILE = "catalog.sqlite3"
DEFAULT_BUSY_TIMEOUT = 10.0
"""How long a writer waits for another process's lock before a clear error."""
DEFAULT_CLAIM_LEASE = 600.0
"""How long a collector's claim holds: one that dies lets go of its work after this."""
CLAIM_BATCH = 100
"""How many expired artifacts a collector claims at a time."""

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

_KEY = (artifacts.c.task_id == bindparam("key_task")) & (
    artifacts.c.artifact_id == bindparam("key_artifact")
)
_LIVE = artifacts.c.state == "live"
_SELECT_TASK = select(*TASK_COLUMNS).where(tasks.c.task_id == bindparam("task_id"))
_SELECT_IDENTICAL = (
    select(*ARTIFACT_COLUMNS)
    .where(
        artifacts.c.task_id == bindparam("task_id"),
        artifacts.c.sha256 == bindparam("sha256"),
        artifacts.c.bytes == bindparam("bytes"),
        _LIVE,
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
_ARTIFACT_KEYS = ("task_id", "artifact_id")
_CLAIMS = {"claimed_by": None, "claimed_until": None}


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
        self._dialect = self.engine.dialect.name
        try:
            with self._errors("migrating the schema"):
                self.migrated = migrate.upgrade(self.engine, self.where)
                """Whether opening this catalog ran migrations (another process may have)."""
        except BaseException:
            self.engine.dispose()
            raise

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        with translated(self.where, self.busy_timeout, doing):
            yield

    @contextmanager
    def transaction(self, doing: str) -> Iterator[Connection]:
        """A write transaction; on SQLite it takes the write lock up front."""
        with self._errors(doing), self.engine.connect() as conn:
            conn.execution_options(**{WRITE: True})
            with conn.begin():
                yield conn

    def _rows(
        self, doing: str, statement: Any, args: Mapping[str, Any] | None = None
    ) -> list[Row[Any]]:
        with self._errors(doing), self.engine.connect() as conn:
            return list(conn.execute(statement, args or {}).all())

    def revision(self) -> str | None:
        """The schema's Alembic revision (migrate.head() once opened)."""
        with self._errors("reading the schema version"), self.engine.connect() as conn:
            return migrate.current(conn)

    # Tasks

    def task(self, task_id: str) -> TaskRow | None:
        rows = self._rows("reading a task", _SELECT_TASK, {"task_id": task_id})
        return TaskRow(**rows[0]._asdict()) if rows else None

    def known_task(self, task_id: str, deleted_too: bool = False) -> TaskRow:
        """The task's row, or a ConfigError that says how to list the tasks there are.

        deleted_too: a deleted task counts as known (its tombstones and audit log stay)."""
        row = self.task(task_id)
        if row is None or (row.state == "deleted" and not deleted_too):
            raise ConfigError(f"no task {task_id!r}: see `spillbox tasks`")
        return row

    def tasks(self, states: Sequence[str] = ("open", "closed")) -> list[TaskRow]:
        statement = select(*TASK_COLUMNS).where(tasks.c.state.in_(states)).order_by(tasks.c.task_id)
        return [TaskRow(**row._asdict()) for row in self._rows("listing tasks", statement)]

    def open_task(self, task_id: str, retention: str) -> TaskRow:
        """Register a task on first use; a later use with another policy records the change."""
        now = time.time()
        with self.transaction("opening a task") as conn:
            found = conn.execute(_SELECT_TASK.with_for_update(), {"task_id": task_id}).first()
            row = None if found is None else TaskRow(**found._asdict())
            if row is None or row.state == "deleted":
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
                conn.execute(self._upsert(tasks, ("task_id",), values))
            else:
                changes: dict[str, Any] = {"state": "open", "closed_at": None, "delete_after": None}
                if row.retention != retention:
                    changes["retention"] = retention
                    _log(conn, task_id, None, "policy", "harness", retention)
                conn.execute(update(tasks).where(tasks.c.task_id == task_id).values(changes))
            found = conn.execute(_SELECT_TASK, {"task_id": task_id}).first()
        assert found is not None
        return TaskRow(**found._asdict())

    def close_task(self, task_id: str, delete_after: float | None) -> None:
        """Close a task, or re-close a closed one with a new deadline (a removal that a
        pin held back clears it, so collection does not retry the removal on every run)."""
        with self.transaction("closing a task") as conn:
            conn.execute(
                update(tasks)
                .where(tasks.c.task_id == task_id, tasks.c.state.in_(("open", "closed")))
                .values(
                    state="closed",
                    closed_at=func.coalesce(tasks.c.closed_at, time.time()),
                    delete_after=delete_after,
                )
            )

    def mark_task_deleted(self, task_id: str, by: str) -> None:
        with self.transaction("deleting a task") as conn:
            conn.execute(
                update(tasks)
                .where(tasks.c.task_id == task_id)
                .values(state="deleted", deleted_at=time.time(), deleted_by=by)
            )

    # Artifacts

    def add_artifact(self, row: ArtifactRow, redacted: str | None = None) -> None:
        """Record an artifact and its offload; `redacted` (replacements per kind, as JSON)
        logs, in the same transaction, that its payload was redacted before it was stored."""
        values = {column.name: getattr(row, column.name) for column in ARTIFACT_COLUMNS}
        values["pinned"] = int(row.pinned)
        if row.tokens_exact is not None:
            values["tokens_exact"] = int(row.tokens_exact)
        with self.transaction("recording an artifact") as conn:
            conn.execute(self._upsert(artifacts, _ARTIFACT_KEYS, {**values, **_CLAIMS}))
            _log(conn, row.task_id, row.artifact_id, "offload", row.tool, row.call_id)
            if redacted is not None:
                _log(conn, row.task_id, row.artifact_id, "redact", "retention", redacted)

    def artifacts(self, task_id: str, include_deleted: bool = False) -> list[ArtifactRow]:
        statement = select(*ARTIFACT_COLUMNS).where(artifacts.c.task_id == task_id)
        if not include_deleted:
            statement = statement.where(_LIVE)
        statement = statement.order_by(artifacts.c.created_at, artifacts.c.artifact_id)
        return [_artifact(row) for row in self._rows("listing artifacts", statement)]

    def find(self, task_id: str, ref: str) -> ArtifactRow | None:
        """An artifact (or its tombstone) by artifact id, file name, or the call id it came from."""
        c = artifacts.c
        statement = (
            select(*ARTIFACT_COLUMNS)
            .where(c.task_id == task_id, or_(c.artifact_id == ref, c.name == ref, c.call_id == ref))
            .order_by(_LIVE.desc(), (c.artifact_id == ref).desc(), c.created_at.desc())
            .limit(1)
        )
        rows = self._rows("finding an artifact", statement)
        return _artifact(rows[0]) if rows else None

    def touch(self, task_id: str, artifact_id: str, expires_at: float | None) -> None:
        with self.transaction("recording an access") as conn:
            conn.execute(
                update(artifacts)
                .where(_KEY)
                .values(
                    last_access_at=time.time(),
                    expires_at=func.coalesce(expires_at, artifacts.c.expires_at),
                ),
                {"key_task": task_id, "key_artifact": artifact_id},
            )

    def set_pinned(self, task_id: str, artifact_id: str, pinned: bool, actor: str) -> None:
        with self.transaction("pinning an artifact") as conn:
            conn.execute(
                update(artifacts).where(_KEY).values(pinned=int(pinned)),
                {"key_task": task_id, "key_artifact": artifact_id},
            )
            _log(conn, task_id, artifact_id, "pin" if pinned else "unpin", actor, "")

    def tombstone(self, task_id: str, artifact_id: str, by: str) -> bool:
        """Mark an artifact deleted, unless pinned; False if it was pinned or already gone
        (the one conditional update that two collectors cannot both win)."""
        args = {"key_task": task_id, "key_artifact": artifact_id, "at": time.time(), "by": by}
        with self.transaction("deleting an artifact") as conn:
            changed = conn.execute(_TOMBSTONE, args).rowcount
            if changed:
                _log(conn, task_id, artifact_id, "delete", "retention", by)
        return bool(changed)

    def identical(self, task_id: str, sha256: str, size: int) -> ArtifactRow | None:
        """A live artifact of the task with exactly these bytes (by digest and size)."""
        args = {"task_id": task_id, "sha256": sha256, "bytes": size}
        rows = self._rows("finding an identical artifact", _SELECT_IDENTICAL, args)
        return _artifact(rows[0]) if rows else None

    def expired(self, now: float) -> list[ArtifactRow]:
        """Every live, unpinned artifact past its expiry (claimed or not: a dry run's list)."""
        statement = select(*ARTIFACT_COLUMNS).where(*_expired(now)).order_by(artifacts.c.expires_at)
        return [_artifact(row) for row in self._rows("finding expired artifacts", statement)]

    # Collection's claims: on Postgres, SELECT ... FOR UPDATE SKIP LOCKED lets collectors
    # on several hosts take disjoint batches without waiting for each other; on SQLite
    # (which has no FOR UPDATE) the write lock serialises the claims, and a file lock in
    # the home already serialises its collectors.

    def claim_expired(
        self, now: float, lease: float = DEFAULT_CLAIM_LEASE, limit: int = CLAIM_BATCH
    ) -> list[ArtifactRow]:
        """Claim up to `limit` expired artifacts that no other collector holds; oldest
        expiry first. A claim lasts `lease` seconds: the tombstone ends the artifact's."""
        unclaimed = or_(artifacts.c.claimed_until.is_(None), artifacts.c.claimed_until <= now)
        batch = (
            select(artifacts.c.task_id, artifacts.c.artifact_id)
            .where(*_expired(now), unclaimed)
            .order_by(artifacts.c.expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        claim = (
            update(artifacts)
            .where(tuple_(artifacts.c.task_id, artifacts.c.artifact_id).in_(batch))
            .values(claimed_by=self.holder, claimed_until=now + lease)
            .returning(*ARTIFACT_COLUMNS)
        )
        with self.transaction("claiming expired artifacts") as conn:
            rows = [_artifact(row) for row in conn.execute(claim)]
        return sorted(rows, key=lambda row: (row.expires_at or 0, row.task_id, row.artifact_id))

    def claim_task(self, task_id: str, now: float, lease: float = DEFAULT_CLAIM_LEASE) -> bool:
        """Claim a closed task for removal; False if another collector holds it."""
        with self.transaction("claiming a task") as conn:
            changed = conn.execute(
                update(tasks)
                .where(
                    tasks.c.task_id == task_id,
                    tasks.c.state == "closed",
                    or_(tasks.c.claimed_until.is_(None), tasks.c.claimed_until <= now),
                )
                .values(claimed_by=self.holder, claimed_until=now + lease)
            ).rowcount
        return bool(changed)

    def release_task(self, task_id: str) -> None:
        """Let go of this collector's claim on a task (kept or removed)."""
        with self.transaction("releasing a task") as conn:
            conn.execute(
                update(tasks)
                .where(tasks.c.task_id == task_id, tasks.c.claimed_by == self.holder)
                .values(_CLAIMS)
            )

    # The access log

    def log(
        self, task_id: str, artifact_id: str | None, action: Action, actor: str, detail: str = ""
    ) -> None:
        with self.transaction("writing the access log") as conn:
            _log(conn, task_id, artifact_id, action, actor, detail)

    def audit(self, task_id: str) -> list[AccessEntry]:
        statement = (
            select(*ACCESS_COLUMNS).where(access_log.c.task_id == task_id).order_by(access_log.c.id)
        )
        return [
            AccessEntry(**row._asdict()) for row in self._rows("reading the access log", statement)
        ]

    def _upsert(self, table: Any, keys: Sequence[str], values: Mapping[str, Any]) -> Insert:
        """INSERT, or replace every column of the row with these keys."""
        dialect = sqlite if self._dialect == "sqlite" else postgresql
        statement = dialect.insert(table).values(values)
        others = {name: statement.excluded[name] for name in values if name not in keys}
        upsert: Insert = statement.on_conflict_do_update(index_elements=list(keys), set_=others)
        return upsert


def _expired(now: float) -> tuple[Any, ...]:
    c = artifacts.c
    return (_LIVE, c.pinned == 0, c.expires_at.is_not(None), c.expires_at <= now)


def _log(
    conn: Connection,
    task_id: str,
    artifact_id: str | None,
    action: Action,
    actor: str,
    detail: str,
) -> None:
    conn.execute(
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


def _artifact(row: Row[Any]) -> ArtifactRow:
    data = row._asdict()
    data["pinned"] = bool(data["pinned"])
    if data["tokens_exact"] is not None:
        data["tokens_exact"] = bool(data["tokens_exact"])
    return ArtifactRow(**data)
