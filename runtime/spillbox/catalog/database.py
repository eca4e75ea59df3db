"""The catalog's database: a SQLAlchemy engine on SQLite (the default) or Postgres, and the
one table of how their drivers' exceptions become spillbox errors.

SQLite: WAL mode, a busy timeout, and write transactions that take the write lock up front
(BEGIN IMMEDIATE), so a read-then-write never fails half way for a lock. Postgres: the
same busy timeout as its lock_timeout, so a writer stuck behind another host's lock fails
with the same clear error.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url

from spillbox.errors import ConfigError, SpillboxError, StorageError

WRITE = "spillbox_write"
"""Execution option of a connection that writes: on SQLite its transaction is IMMEDIATE."""

SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA foreign_keys=ON", "PRAGMA synchronous=NORMAL")
POSTGRES_SCHEMES = ("postgres", "postgresql")
"""URL schemes that mean Postgres through psycopg 3 (SQLAlchemy's default would be psycopg2)."""
LOCK_NOT_AVAILABLE = "55P03"
"""Postgres's SQLSTATE when lock_timeout ran out."""


def catalog_url(raw: str) -> URL:
    """A catalog URL as SQLAlchemy takes it: postgresql:// means psycopg 3."""
    try:
        url = make_url(raw)
    except exc.ArgumentError:
        raise ConfigError(
            f"the catalog URL {raw!r} is not a database URL: use postgresql://USER@HOST/DB "
            "(or sqlite:///PATH)"
        ) from None
    if url.drivername in POSTGRES_SCHEMES:
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"the catalog URL names {url.get_backend_name()!r}: spillbox's catalog runs on "
            "SQLite or Postgres (postgresql://USER@HOST/DB)"
        )
    return url


def sqlite_url(path: Path) -> URL:
    return URL.create("sqlite+pysqlite", database=str(path))


def make_engine(url: URL, busy_timeout: float) -> Engine:
    """An engine for the catalog; nothing is connected yet."""
    if url.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": busy_timeout})
        event.listen(engine, "connect", _sqlite_connected)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    try:
        return create_engine(
            url,
            connect_args={"options": f"-c lock_timeout={int(busy_timeout * 1000)}"},
            pool_pre_ping=True,
        )
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"the catalog is on Postgres but its driver is missing ({e.name}): "
            "pip install 'spillbox[postgres]'"
        ) from None


def _sqlite_connected(dbapi_connection: sqlite3.Connection, record: Any) -> None:
    # The driver's own transaction handling is off: spillbox says when to begin, and how.
    dbapi_connection.isolation_level = None
    for pragma in SQLITE_PRAGMAS:
        dbapi_connection.execute(pragma)


def _sqlite_begin(connection: Connection) -> None:
    # Reads run in autocommit (a WAL reader never waits); writes take the lock up front.
    if connection.get_execution_options().get(WRITE):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


@contextmanager
def translated(where: str, busy_timeout: float, doing: str) -> Iterator[None]:
    """Every database exception as one StorageError line that says what to do next."""
    try:
        yield
    except SpillboxError:
        raise
    except exc.DBAPIError as e:
        raise _error(e, where, busy_timeout, doing) from e


def _error(e: exc.DBAPIError, where: str, busy_timeout: float, doing: str) -> SpillboxError:
    orig = e.orig
    said = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    sqlite = isinstance(orig, sqlite3.Error)
    if isinstance(e, exc.OperationalError):
        if (sqlite and ("locked" in said or "busy" in said)) or (
            getattr(orig, "sqlstate", None) == LOCK_NOT_AVAILABLE
        ):
            return StorageError(
                f"the catalog {where} stayed locked by another process for "
                f"{busy_timeout:g} s while {doing}; retry, or find the stuck process"
            )
        if _cannot_connect(orig):
            return StorageError(
                f"cannot reach the catalog database {where} while {doing} ({said}): check "
                "SPILLBOX_CATALOG_URL and that the server runs"
            )
        return StorageError(f"the catalog {where} failed while {doing}: {said}")
    if isinstance(e, exc.IntegrityError):
        return StorageError(
            f"the catalog {where} refused a record ({said}) while {doing}: nothing was "
            "written; this is a spillbox bug, please report it with this line"
        )
    if sqlite and isinstance(e, exc.DatabaseError):
        return StorageError(
            f"the catalog {where} is damaged ({said}) while {doing}: "
            "restore it from a backup or move it aside"
        )
    return StorageError(f"the catalog {where} failed while {doing}: {said}")


def _cannot_connect(orig: BaseException | None) -> bool:
    """Postgres refused or never answered (SQLSTATE class 08, or none: no connection)."""
    sqlstate = getattr(orig, "sqlstate", "")
    return not isinstance(orig, sqlite3.Error) and (not sqlstate or sqlstate.startswith("08"))
