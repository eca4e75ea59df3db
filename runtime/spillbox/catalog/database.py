"""The catalog's database: SQLite (the default, through sqlite3) or Postgres (through a
SQLAlchemy engine), the statements run on it, and the one table of how their drivers'
exceptions become spillbox errors.

SQLite: WAL mode, a busy timeout, reads in autocommit (a WAL reader never waits), and
write transactions that take the write lock up front (BEGIN IMMEDIATE), so a
read-then-write never fails half way for a lock. Postgres: the same busy timeout as its
lock_timeout, so a writer stuck behind another host's lock fails with the same clear error;
a read is one round trip to the server (autocommit: no BEGIN, no ROLLBACK) and a write
transaction its statements and two more (BEGIN, COMMIT). No ping before each use (it cost
a round trip, and with psycopg's own BEGIN a second): a pooled connection the server
dropped meanwhile fails at the read or the BEGIN that opens its use, before anything was
done on it, and that one statement runs again on another connection.

The catalog's statements are SQLAlchemy Core (statements.py), compiled once for the
dialect and run on the driver's own connection (Database): SQLAlchemy's execution layer (a
connection checkout, an execution context, a result object) cost about 0.1 ms a statement
on SQLite, several times the statement itself, and a 4 KB offload runs four of them. On
SQLite the compiled SQL is kept beside the catalog (SqlCache), so that a short-lived
process (a CLI command) does not import SQLAlchemy at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import FunctionType
from typing import TYPE_CHECKING, Any, TypeVar

from spillbox.errors import ConfigError, SpillboxError, StorageError

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.engine import URL
    from sqlalchemy.engine.interfaces import DBAPICursor
    from sqlalchemy.pool import PoolProxiedConnection
    from sqlalchemy.sql.compiler import SQLCompiler

    Cursor = DBAPICursor | sqlite3.Cursor

SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA foreign_keys=ON", "PRAGMA synchronous=NORMAL")
POSTGRES_SCHEMES = ("postgres", "postgresql")
"""URL schemes that mean Postgres through psycopg 3 (SQLAlchemy's default would be psycopg2)."""
LOCK_NOT_AVAILABLE = "55P03"
"""Postgres's SQLSTATE when lock_timeout ran out."""
SQL_CACHE_SUFFIX = "-sql.json"
"""The file beside a SQLite catalog (catalog.sqlite3-sql.json) that keeps its statements'
compiled SQL (SqlCache)."""
_T = TypeVar("_T")


def catalog_url(raw: str) -> URL:
    """A catalog URL as SQLAlchemy takes it: postgresql:// means psycopg 3."""
    from sqlalchemy import exc
    from sqlalchemy.engine import make_url

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
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise ConfigError(
            f"the catalog URL {raw!r} names no file: a catalog in memory would be lost at "
            "exit; use sqlite:///PATH"
        )
    return url


def make_engine(url: URL, busy_timeout: float) -> Engine:
    """An engine for the catalog; nothing is connected yet."""
    from sqlalchemy import create_engine, event
    from sqlalchemy.pool import NullPool

    if url.get_backend_name() == "sqlite":
        # No pool: the catalog's own statements run on connections Database keeps; this
        # engine serves migrations.
        engine = create_engine(
            url,
            connect_args={"timeout": busy_timeout, "check_same_thread": False},
            poolclass=NullPool,
        )
        event.listen(engine, "connect", lambda connection, _: _sqlite_ready(connection))
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


def _sqlite_ready(connection: sqlite3.Connection) -> sqlite3.Connection:
    # The driver's own transaction handling is off: spillbox says when to begin, and how.
    connection.isolation_level = None
    for pragma in SQLITE_PRAGMAS:
        connection.execute(pragma)
    return connection


def begin_write(connection: Connection) -> None:
    """Start the write transaction for real: on SQLite, taking the write lock now (the
    driver's own BEGIN is off); Postgres began it with the first statement."""
    if connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")


@dataclass(frozen=True)
class Statement:
    """A catalog statement by its name in catalog/statements.py: a statement there, or a
    function called with the catalog's dialect and these arguments.

    insert: an INSERT, compiled for the columns of the parameters it is run with."""

    name: str
    args: tuple[Hashable, ...] = ()
    insert: bool = False

    def key(self, columns: Sequence[str]) -> str:
        """Its name in the compiled cache."""
        key = self.name + (repr(self.args) if self.args else "")
        return f"{key} ({', '.join(columns)})" if self.insert else key


class Prepared:
    """One statement compiled for one dialect: its SQL, and its parameters in the order and
    form the driver takes them (values fixed in the statement, like 'live', filled in)."""

    def __init__(self, sql: str, fixed: dict[str, Any], order: Sequence[str] | None = None) -> None:
        self.sql = sql
        self._fixed = fixed
        self._order = order

    @classmethod
    def compiled(cls, compiled: SQLCompiler) -> Prepared:
        fixed = {name: bind.value for name, bind in compiled.binds.items()}
        return cls(compiled.string, fixed, compiled.positiontup)

    def saved(self) -> list[Any]:
        return [self.sql, self._fixed, self._order]

    def args(self, params: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        if self._order is None:
            return {**self._fixed, **params}
        return [params[name] if name in params else self._fixed[name] for name in self._order]


class SqlCache:
    """The statements' SQL compiled before, by Statement.key, kept in a file beside a SQLite
    catalog (none for Postgres: kept in memory), so that a process that finds every
    statement it runs there never imports SQLAlchemy (about 160 ms, most of a CLI command's
    start). The file counts only if it was written from the very statement definitions this
    process has (the fingerprint); a file that is missing, damaged or of other definitions
    is written again, whole, by the next compile."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._prepared: dict[str, Prepared] = {}
        self._saved: dict[str, list[Any]] = {} if path is None else _read_cache(path)
        """What the file held when read (or as this process last wrote it)."""

    def get(self, key: str) -> Prepared | None:
        found = self._prepared.get(key)
        if found is None:
            entry = self._saved.get(key)
            if entry is None and self.path is not None:
                # Written since this process read it: by the child that migrated a new
                # catalog (it compiles a session's statements too, see migrate), or by
                # another process. Read again only for a statement not known yet.
                self._saved = {**_read_cache(self.path), **self._saved}
                entry = self._saved.get(key)
            if entry is not None:
                found = self._prepared[key] = Prepared(*entry)
        return found

    def put(self, key: str, prepared: Prepared) -> None:
        with self._lock:
            self._prepared[key] = prepared
            if self.path is None:
                return
            # Another process may have saved statements meanwhile: keep theirs too.
            self._saved = {**_read_cache(self.path), **self._saved, key: prepared.saved()}
            _write_cache(self.path, self._saved)


@cache
def _fingerprint() -> str:
    """The sha256 of the sources that define the statements' SQL: the statements, the
    tables, and the records whose fields are the columns read."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for source in (here / "statements.py", here / "schema.py", here.parent / "types.py"):
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _read_cache(path: Path) -> dict[str, list[Any]]:
    try:
        saved = json.loads(path.read_bytes())
        if saved["fingerprint"] == _fingerprint() and all(
            _well_formed(key, entry) for key, entry in saved["statements"].items()
        ):
            statements: dict[str, list[Any]] = saved["statements"]
            return statements
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass  # none yet, or not one this process can trust: compiled again
    return {}


def _well_formed(key: object, entry: object) -> bool:
    """An entry as Prepared.saved() writes it: SQL, fixed values, the parameters' order."""
    match entry:
        case [str(), dict(), list() | None]:
            return isinstance(key, str)
    return False


def sql_cache_path(sqlite: Path) -> Path:
    """The SqlCache file beside a SQLite catalog."""
    return sqlite.with_name(sqlite.name + SQL_CACHE_SUFFIX)


def merge_cache(path: Path, source: Path) -> None:
    """Add the statements compiled in source (another catalog's cache file) to path's."""
    _write_cache(path, {**_read_cache(path), **_read_cache(source)})


def _write_cache(path: Path, statements: dict[str, list[Any]]) -> None:
    """Written whole under another name, then renamed: a reader sees the old or the new."""
    try:
        data = json.dumps({"fingerprint": _fingerprint(), "statements": statements})
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(data)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except (OSError, TypeError, ValueError):
        pass  # kept in memory: the next process compiles again, nothing is wrong


class Transaction:
    """The statements of one write transaction (Database.transaction)."""

    def __init__(self, database: Database, cursor: Cursor) -> None:
        self._database = database
        self._cursor = cursor

    def execute(self, statement: Statement, params: Mapping[str, Any] = {}) -> int:
        """Run it; how many rows it changed."""
        self._database.run(self._cursor, statement, params)
        return int(self._cursor.rowcount)

    def rows(self, statement: Statement, params: Mapping[str, Any] = {}) -> list[dict[str, Any]]:
        self._database.run(self._cursor, statement, params)
        return _dicts(self._cursor)


class Database:
    """The catalog's statements on the driver's connections.

    SQLite (sqlite: the file): one sqlite3 connection per thread, kept (sqlite3 wants a
    connection per thread; opening one per statement would cost more than the statement);
    SQLAlchemy is imported only to compile a statement the SqlCache lacks, or to migrate.
    Postgres (url): one connection from the SQLAlchemy engine's pool for each operation.
    """

    def __init__(
        self,
        where: str,
        busy_timeout: float,
        sqlite: Path | None = None,
        url: URL | None = None,
    ) -> None:
        self.where = where
        self.busy_timeout = busy_timeout
        self.sqlite = sqlite
        self.dialect = "sqlite" if sqlite is not None else "postgresql"
        self._engine = None if url is None else make_engine(url, busy_timeout)
        self._cache = SqlCache(None if sqlite is None else sql_cache_path(sqlite))
        self._kept: dict[threading.Thread, sqlite3.Connection] = {}
        self._lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for SQLite made when first asked for: migrations)."""
        if self._engine is None:
            from sqlalchemy.engine import URL

            assert self.sqlite is not None
            url = URL.create("sqlite+pysqlite", database=str(self.sqlite))
            with self._lock:
                self._engine = self._engine or make_engine(url, self.busy_timeout)
        return self._engine

    def close(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, {}
        for connection in kept.values():
            connection.close()
        if self._engine is not None:
            self._engine.dispose()

    def prepare(self, statement: Statement, columns: Sequence[str] = ()) -> Prepared:
        """The statement compiled for this dialect, once (an INSERT's columns are the
        parameters it is given)."""
        key = statement.key(columns)
        found = self._cache.get(key)
        if found is None:
            from sqlalchemy.sql.compiler import SQLCompiler

            from spillbox.catalog import statements

            built = getattr(statements, statement.name)
            if isinstance(built, FunctionType):
                built = built(self.dialect, *statement.args)
            assert bool(getattr(built, "is_insert", False)) == statement.insert, statement
            compiled = built.compile(dialect=self.engine.dialect, column_keys=list(columns) or None)
            assert isinstance(compiled, SQLCompiler)
            found = Prepared.compiled(compiled)
            self._cache.put(key, found)
        return found

    def run(self, cursor: Cursor, statement: Statement, params: Mapping[str, Any]) -> None:
        prepared = self.prepare(statement, tuple(params) if statement.insert else ())
        cursor.execute(prepared.sql, prepared.args(params))

    def errors(self, doing: str) -> AbstractContextManager[None]:
        """Exceptions of the database (through SQLAlchemy or not) as spillbox errors."""
        return translated(self.where, self.busy_timeout, doing)

    @contextmanager
    def _connection(self, doing: str) -> Iterator[sqlite3.Connection]:
        """SQLite: this thread's kept connection."""
        assert self.sqlite is not None
        with self.errors(doing):
            thread = threading.current_thread()
            kept = self._kept.get(thread)
            if kept is None:
                with self._lock:
                    for gone in [t for t in self._kept if not t.is_alive()]:
                        self._kept.pop(gone).close()
                connection = sqlite3.connect(
                    self.sqlite, timeout=self.busy_timeout, check_same_thread=False
                )
                kept = self._kept[thread] = _sqlite_ready(connection)
            yield kept

    @contextmanager
    def _postgres(
        self, doing: str, first: Callable[[Cursor], _T]
    ) -> Iterator[tuple[PoolProxiedConnection, Cursor, _T]]:
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
        self, doing: str, statement: Statement | str, params: Mapping[str, Any] = {}
    ) -> list[dict[str, Any]]:
        """A read: its rows as dicts of column names. A str is plain SQL with no parameters,
        run as it is. On Postgres also one statement that writes and returns rows (INSERT
        ... RETURNING), committed alone: sent again on another connection if the one pooled
        was found dropped, so the caller must tell its own earlier write from another's."""

        def read(cursor: Cursor) -> list[dict[str, Any]]:
            if isinstance(statement, str):
                cursor.execute(statement)
            else:
                self.run(cursor, statement, params)
            return _dicts(cursor)

        if self.sqlite is None:
            with self._postgres(doing, read) as (_, _, found):
                return found
        with self._connection(doing) as connection:
            cursor = connection.cursor()
            try:
                return read(cursor)
            finally:
                cursor.close()

    def batch(self, doing: str, statements: Sequence[tuple[Statement, Mapping[str, Any]]]) -> None:
        """Writes whose results nothing needs, in one transaction: on Postgres sent at once
        with their BEGIN and COMMIT (psycopg's pipeline: one round trip, where a
        transaction() of two statements takes four) and sent again on another connection
        if the server had dropped the one pooled; on SQLite as transaction() runs them."""
        if self.sqlite is None:

            def send(cursor: Cursor) -> None:
                with cursor.connection.pipeline():  # type: ignore[union-attr]
                    cursor.execute("BEGIN")
                    for statement, params in statements:
                        self.run(cursor, statement, params)
                    cursor.execute("COMMIT")

            with self._postgres(doing, send):
                return
        with self.transaction(doing) as tx:
            for statement, params in statements:
                tx.execute(statement, params)

    @contextmanager
    def transaction(self, doing: str) -> Iterator[Transaction]:
        """A write transaction; on SQLite it takes the write lock up front."""
        if self.sqlite is None:
            with self._postgres(doing, lambda cursor: cursor.execute("BEGIN")) as opened:
                connection, cursor, _ = opened
                try:
                    yield Transaction(self, cursor)
                    connection.commit()
                except BaseException:
                    connection.rollback()
                    raise
            return
        with self._connection(doing) as kept:
            cursor = kept.cursor()
            try:
                cursor.execute("BEGIN IMMEDIATE")
                try:
                    yield Transaction(self, cursor)
                    kept.commit()
                except BaseException:
                    kept.rollback()  # a failed commit too: the connection is kept
                    raise
            finally:
                cursor.close()


def _dropped(e: BaseException, driver: Any) -> bool:
    """Whether e says the server had dropped the connection (psycopg marks it broken)."""
    return _kind(e) == "OperationalError" and bool(getattr(driver, "broken", False))


def _dicts(cursor: Cursor) -> list[dict[str, Any]]:
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
    except Exception as e:
        # SQLAlchemy's DBAPIError wraps the driver's exception (SQLAlchemy is not imported
        # to tell: a process that never imported it raises none).
        orig = e.orig if _named(e, "DBAPIError") else e  # type: ignore[attr-defined]
        if _kind(orig) is None:
            raise
        raise _error(orig, where, busy_timeout, doing) from e


def _kind(e: BaseException | None) -> str | None:
    """The PEP 249 category of a driver's exception (its classes are named by the PEP)."""
    for kind in ("IntegrityError", "OperationalError", "DatabaseError"):
        if _named(e, kind):
            return kind
    return None


def _named(e: BaseException | None, name: str) -> bool:
    """Whether e is an instance of a class of this name."""
    return any(cls.__name__ == name for cls in type(e).__mro__)


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
