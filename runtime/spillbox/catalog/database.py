"""The catalog's database: a SQLAlchemy engine on SQLite (the default) or Postgres, the
statements run on it, and the one table of how their drivers' exceptions become spillbox
errors.

SQLite: WAL mode, a busy timeout, reads in autocommit (a WAL reader never waits), and
write transactions that take the write lock up front (BEGIN IMMEDIATE), so a
read-then-write never fails half way for a lock. Postgres: the same busy timeout as its
lock_timeout, so a writer stuck behind another host's lock fails with the same clear error;
a read is one round trip to the server (autocommit: no BEGIN, no ROLLBACK) and a write
transaction its statements and two more (BEGIN, COMMIT). No ping before each use (it cost
a round trip, and with psycopg's own BEGIN a second): a pooled connection the server
dropped meanwhile fails at the read or the BEGIN that opens its use, before anything was
done on it, and that one statement runs again on another connection.

The catalog's statements are SQLAlchemy Core, compiled once for the engine's dialect and
run on the driver's own connection (Database): SQLAlchemy's execution layer (a connection
checkout, an execution context, a result object) cost about 0.1 ms a statement on SQLite,
several times the statement itself, and a 4 KB offload runs four of them.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.pool import NullPool, PoolProxiedConnection
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from spillbox.errors import ConfigError, SpillboxError, StorageError

SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA foreign_keys=ON", "PRAGMA synchronous=NORMAL")
POSTGRES_SCHEMES = ("postgres", "postgresql")
"""URL schemes that mean Postgres through psycopg 3 (SQLAlchemy's default would be psycopg2)."""
LOCK_NOT_AVAILABLE = "55P03"
"""Postgres's SQLSTATE when lock_timeout ran out."""
_T = TypeVar("_T")


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
        # No pool: the catalog keeps one connection per thread itself (see Catalog).
        engine = create_engine(
            url,
            connect_args={"timeout": busy_timeout, "check_same_thread": False},
            poolclass=NullPool,
        )
        event.listen(engine, "connect", _sqlite_connected)
        return engine
    try:
        # No pool_pre_ping: Database replaces a connection found dropped (_postgres).
        return create_engine(
            url, connect_args={"options": f"-c lock_timeout={int(busy_timeout * 1000)}"}
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


def begin_write(connection: Connection) -> None:
    """Start the write transaction for real: on SQLite, taking the write lock now (the
    driver's own BEGIN is off); Postgres began it with the first statement."""
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")


class Prepared:
    """One statement compiled for one dialect: its SQL, and its parameters in the order and
    form the driver takes them (values fixed in the statement, like 'live', filled in)."""

    def __init__(self, compiled: SQLCompiler) -> None:
        self.sql = compiled.string
        self._fixed = {name: bind.value for name, bind in compiled.binds.items()}
        self._order = compiled.positiontup

    def args(self, params: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        if self._order is None:
            return {**self._fixed, **params}
        return [params[name] if name in params else self._fixed[name] for name in self._order]


class Transaction:
    """The statements of one write transaction (Database.transaction)."""

    def __init__(self, database: Database, cursor: DBAPICursor) -> None:
        self._database = database
        self._cursor = cursor

    def execute(self, statement: ClauseElement, params: Mapping[str, Any] = {}) -> int:
        """Run it; how many rows it changed."""
        self._database.run(self._cursor, statement, params)
        return int(self._cursor.rowcount)

    def rows(
        self, statement: ClauseElement, params: Mapping[str, Any] = {}
    ) -> list[dict[str, Any]]:
        self._database.run(self._cursor, statement, params)
        return _dicts(self._cursor)


class Database:
    """The catalog's statements on the engine's driver connections.

    SQLite: one connection per thread, kept (sqlite3 wants a connection per thread; opening
    one per statement would cost more than the statement). Postgres: one from the engine's
    pool for each operation.
    """

    def __init__(self, engine: Engine, where: str, busy_timeout: float) -> None:
        self.engine = engine
        self.where = where
        self.busy_timeout = busy_timeout
        self.sqlite = engine.dialect.name == "sqlite"
        self._prepared: dict[tuple[int, tuple[str, ...]], tuple[ClauseElement, Prepared]] = {}
        self._kept: dict[threading.Thread, PoolProxiedConnection] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, {}
        for connection in kept.values():
            connection.close()
        self.engine.dispose()

    def prepare(self, statement: ClauseElement, keys: Sequence[str] = ()) -> Prepared:
        """The statement compiled for this dialect, once (statements are module constants;
        an INSERT's columns are the keys it is given)."""
        key = (id(statement), tuple(keys))
        found = self._prepared.get(key)
        if found is None:
            compiled = statement.compile(
                dialect=self.engine.dialect, column_keys=list(keys) or None
            )
            assert isinstance(compiled, SQLCompiler)
            found = (statement, Prepared(compiled))
            with self._lock:
                self._prepared[key] = found  # the statement kept: its id stays its own
        return found[1]

    def run(self, cursor: DBAPICursor, statement: ClauseElement, params: Mapping[str, Any]) -> None:
        prepared = self.prepare(statement, tuple(params) if _is_insert(statement) else ())
        cursor.execute(prepared.sql, prepared.args(params))

    def errors(self, doing: str) -> AbstractContextManager[None]:
        """Exceptions of the database (through SQLAlchemy or not) as spillbox errors."""
        return translated(self.where, self.busy_timeout, doing)

    @contextmanager
    def _connection(self, doing: str) -> Iterator[PoolProxiedConnection]:
        """SQLite: this thread's kept connection."""
        with self.errors(doing):
            thread = threading.current_thread()
            kept = self._kept.get(thread)
            if kept is None:
                with self._lock:
                    for gone in [t for t in self._kept if not t.is_alive()]:
                        self._kept.pop(gone).close()
                kept = self._kept[thread] = self.engine.raw_connection()
            yield kept

    @contextmanager
    def _postgres(
        self, doing: str, first: Callable[[DBAPICursor], _T]
    ) -> Iterator[tuple[PoolProxiedConnection, DBAPICursor, _T]]:
        """A connection of the pool in autocommit, the cursor that ran first(cursor) on it
        (a read, or the BEGIN of a transaction), and what first returned. A connection the
        server dropped while it was pooled (a restart, an idle timeout) fails at that first
        statement, before anything was done on it: it is thrown away and first runs again
        on another (the pool's ping before each use did this at a round trip's cost)."""
        # Each connection idle in the pool may have been dropped (a server restart drops
        # them all): at most that many are thrown away, then a new one is made.
        size = getattr(self.engine.pool, "size", lambda: 5)
        with self.errors(doing):
            for attempt in range(int(size()) + 1):
                connection = self.engine.raw_connection()
                driver = connection.driver_connection
                try:
                    driver.autocommit = True  # type: ignore[union-attr]
                    cursor = connection.cursor()
                    found = first(cursor)
                except BaseException as e:
                    connection.invalidate()
                    if attempt < size() and _dropped(e, driver):
                        continue
                    raise
                try:
                    yield connection, cursor, found
                except BaseException:
                    connection.invalidate()  # whatever state it is in, it is not reused
                    raise
                cursor.close()
                driver.autocommit = False  # type: ignore[union-attr]  # as the pool gave it
                connection.close()
                return

    def rows(
        self, doing: str, statement: ClauseElement, params: Mapping[str, Any] = {}
    ) -> list[dict[str, Any]]:
        """A read: its rows as dicts of column names."""

        def read(cursor: DBAPICursor) -> list[dict[str, Any]]:
            self.run(cursor, statement, params)
            return _dicts(cursor)

        if not self.sqlite:
            with self._postgres(doing, read) as (_, _, found):
                return found
        with self._connection(doing) as connection:
            cursor = connection.cursor()
            try:
                return read(cursor)
            finally:
                cursor.close()

    @contextmanager
    def transaction(self, doing: str) -> Iterator[Transaction]:
        """A write transaction; on SQLite it takes the write lock up front."""
        if not self.sqlite:
            with self._postgres(doing, lambda cursor: cursor.execute("BEGIN")) as opened:
                connection, cursor, _ = opened
                try:
                    yield Transaction(self, cursor)
                    connection.commit()
                except BaseException:
                    connection.rollback()
                    raise
            return
        with self._connection(doing) as connection:
            cursor = connection.cursor()
            try:
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    yield Transaction(self, cursor)
                    connection.commit()
                except BaseException:
                    connection.rollback()  # a failed commit too: the connection is kept
                    raise
            finally:
                cursor.close()


def _dropped(e: BaseException, driver: Any) -> bool:
    """Whether e says the server had dropped the connection (psycopg marks it broken)."""
    return _kind(e) == "OperationalError" and bool(getattr(driver, "broken", False))


def _is_insert(statement: ClauseElement) -> bool:
    return getattr(statement, "is_insert", False) is True


def _dicts(cursor: DBAPICursor) -> list[dict[str, Any]]:
    names = [column[0] for column in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@contextmanager
def translated(where: str, busy_timeout: float, doing: str) -> Iterator[None]:
    """Every database exception, through SQLAlchemy or straight from the driver, as one
    StorageError line that says what to do next."""
    try:
        yield
    except SpillboxError:
        raise
    except UnicodeEncodeError as e:
        # Before the driver sent anything: nothing was written.
        raise ConfigError(
            f"the catalog {where} cannot hold text with a lone surrogate (not valid Unicode, "
            f"at position {e.start}) while {doing}: give ids and names as valid text"
        ) from None
    except exc.DBAPIError as e:
        raise _error(e.orig, where, busy_timeout, doing) from e
    except Exception as e:
        if _kind(e) is None:
            raise
        raise _error(e, where, busy_timeout, doing) from e


def _kind(e: BaseException | None) -> str | None:
    """The PEP 249 category of a driver's exception (its classes are named by the PEP)."""
    names = {cls.__name__ for cls in type(e).__mro__}
    for kind in ("IntegrityError", "OperationalError", "DatabaseError"):
        if kind in names:
            return kind
    return None


def _error(
    orig: BaseException | None, where: str, busy_timeout: float, doing: str
) -> SpillboxError:
    said = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    sqlite = isinstance(orig, sqlite3.Error)
    kind = _kind(orig)
    if kind == "OperationalError":
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
    if kind == "IntegrityError":
        return StorageError(
            f"the catalog {where} refused a record ({said}) while {doing}: nothing was "
            "written; this is a spillbox bug, please report it with this line"
        )
    if sqlite and kind == "DatabaseError":
        return StorageError(
            f"the catalog {where} is damaged ({said}) while {doing}: "
            "restore it from a backup or move it aside"
        )
    return StorageError(f"the catalog {where} failed while {doing}: {said}")


def _cannot_connect(orig: BaseException | None) -> bool:
    """Postgres refused or never answered (SQLSTATE class 08, or none: no connection)."""
    sqlstate = getattr(orig, "sqlstate", "")
    return not isinstance(orig, sqlite3.Error) and (not sqlstate or sqlstate.startswith("08"))
