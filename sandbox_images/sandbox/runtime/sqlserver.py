"""The task's SQL engine: one long-lived DuckDB process per sandbox, shared by every host
process that queries the task.

Runs as its own uid (not the scripts' uid, so scripts can neither signal it nor reach its
socket) and keeps each artifact loaded as a table in /sandbox/cache, so a payload is parsed
once per task and every later query answers from the table in milliseconds, instead of
re-parsing the JSON (400 ms for 40 MB) and re-importing duckdb (260 ms) each time.

One file, two roles:

    python3 sqlserver.py          the relay: what a host process execs. It forwards request
                                  lines from stdin to the engine over a Unix socket and each
                                  answer back to stdout as an END frame (wire.py), and
                                  starts the engine (under a lock, so only once) when none
                                  answers. It does not import duckdb.
    python3 sqlserver.py serve    the engine: one thread and one DuckDB connection per relay,
                                  so one process's long query does not hold up another's.

Request:  {"sql": "...", "timeout": 30, "max_bytes": 33554432}
Response: {"exit_code": 0, "stdout": "csv...", "stderr": "", "timed_out": false,
           "truncated": false, "pid": 123}

Model-written SQL is hostile. File access is limited to /sandbox/offload (read) and
/sandbox/work, and the configuration is locked before any request runs. SQL only reads:
statements that can only write (CREATE, DROP, INSERT, ATTACH, SET, ...) are refused with a
clear error, and every query runs in a transaction that is rolled back, so a write that
hides inside a SELECT (a DELETE in a WITH clause) changes nothing either, and a query that
runs twice (the host retries one whose engine died) has the same effect as once.

A query that reads an offloaded file by its path (read_json_auto('/sandbox/offload/c1.json'),
or the quoted path as a table) is rewritten to the artifact's table, using DuckDB's own
parser to find where, so it answers at the table's speed and with the same rows.

A JSON object that wraps records (an API's {"total_count": .., "items": [...]}) is one row
in its table; each array of objects in it, up to RECORDS_MAX_DEPTH keys deep, is also a
table of its own with one row per record, named by the artifact's id and the path as the
notice writes it ("c1/items", "c1/data.search.nodes", 'c1/["a.b"].items'): queried as fast
as the same records stored as a bare array, where unnest over the one row re-reads the
whole list on every query. These records tables load first, from the same parse as the
object's own table, and a query over them does not wait for that one. Request
{"preload": true} loads every artifact not loaded yet in the background, newest first (the
host sends it once a payload is offloaded).
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import wire

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

OFFLOAD = "/sandbox/offload"
WORK = "/sandbox/work"
CACHE = "/sandbox/cache"
DATABASE = f"{CACHE}/tables.duckdb"
SOCKET = f"{CACHE}/engine.sock"
START_LOCK = f"{CACHE}/engine.lock"
ENGINE_LOG = f"{CACHE}/engine.log"
LOADED = "_spillbox_loaded"
"""What is loaded: a row per part of an artifact (its id for its own table, and for a JSON
object its id and RECORDS for its records tables) and the stamp of the file it was read from."""
WHOLE = ""
RECORDS = "/"
"""The parts of an artifact loaded apart, as suffixes of its id in LOADED."""
PARSED = "_spillbox_parsed"
"""The temporary table (a cursor's own, in memory) a JSON object is parsed into while its
records tables and then its own table are made from it."""
READERS = {
    "json": "read_json_auto('{path}', maximum_object_size={size})",
    "ndjson": "read_json_auto('{path}', format='newline_delimited')",
    "csv": "read_csv_auto('{path}')",
}
MIN_OBJECT_SIZE = 64 * 1024 * 1024
LOAD_ATTEMPTS = 5
"""Loads of a growing file before the table keeps what the last one read."""
SETTLE_SECONDS = 0.1
"""How long an NDJSON file may end mid-line, unchanged, before it is loaded as it is."""
PATH_READERS = {
    "json": {"read_json_auto", "read_json"},
    "ndjson": {"read_json_auto", "read_json", "read_ndjson_auto", "read_ndjson"},
    "csv": {"read_csv_auto", "read_csv"},
}
"""The table functions that, given only an artifact's path, read it as its table holds it."""
SAME_AS_TABLE_OPTIONS = {"maximum_object_size", "sample_size", "auto_detect"}
"""Options that do not change what those functions read (beyond letting it load)."""
READING_STATEMENTS = {"SELECT", "EXPLAIN", "COPY", "PRAGMA", "CALL"}
"""Statement kinds SQL may run (COPY writes only files, under /sandbox/work: the only
writable folder DuckDB is allowed, with no temporary directory); the rest can only change
the database and are refused."""
FETCH_ROWS = 2048
START_SECONDS = 60.0
"""How long a relay waits for an engine it started to answer."""
CHECK_SECONDS = 5.0
"""How often an idle engine checks that its socket is still its own (the host deletes the
cache when an artifact is deleted; an engine nobody can reach then exits)."""
WAL_BYTES = "256MiB"
"""How much a load may leave in DuckDB's write-ahead log before its commit checkpoints the
tables file (DuckDB's default, 16 MiB, made every large load write its table twice before
the query waiting for it ran: 0.3 s of a 40 MB wrapped object's 1 s). The preload
checkpoints once it has loaded, after the queries it served, so the log stays small."""
CHECKPOINT_ATTEMPTS = 10
CHECKPOINT_PAUSE = 0.05
"""A checkpoint waits for queries begun before the last load's commit (DuckDB refuses one
while they run): tried this many times, this far apart, then left to the next preload or
to WAL_BYTES."""
NOWHERE = (1 << 64) - 1
"""DuckDB's query_location for a node that has none."""
RECORDS_MAX_DEPTH = 4
"""Arrays of objects this many keys deep at most get a records table (as deep as the host's
profile looks for records)."""
PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Refused(Exception):
    """A query that SQL in spillbox does not run."""


# The relay


def relay() -> int:
    try:
        engine = _connect_or_start()
    except (OSError, RuntimeError) as e:
        sys.stderr.write(f"the SQL engine could not start: {e}\n")
        return 1
    answers = engine.makefile("rb")
    for line in sys.stdin.buffer:
        try:
            engine.sendall(line)
            answer = answers.readline()
        except OSError:
            answer = b""
        if not answer.endswith(b"\n"):
            sys.stderr.write(f"the SQL engine stopped: {_log_tail()}\n")
            return 1
        wire.frame(sys.stdout.buffer, wire.END, answer.rstrip(b"\n"))
    return 0


def _connect() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(SOCKET)
    except OSError:
        sock.close()
        raise
    return sock


def _connect_or_start() -> socket.socket:
    try:
        return _connect()
    except OSError:
        pass
    os.umask(0o077)
    # One relay starts the engine; the others wait on the lock, then find it answering.
    with open(START_LOCK, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            return _connect()
        except OSError:
            pass
        with open(ENGINE_LOG, "wb") as log:
            engine = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "serve"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # not in the relay's group: it outlives the relay
            )
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                return _connect()
            except OSError:
                if engine.poll() is not None:
                    raise RuntimeError(_log_tail()) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer within {START_SECONDS:.0f} s") from None
                time.sleep(0.005)


def _log_tail() -> str:
    try:
        with open(ENGINE_LOG, "rb") as log:
            lines = log.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1] if lines else "no error message"


# The engine


def serve() -> None:
    import duckdb

    # The cache folder (tables, log, socket) is the engine uid's alone (mode 0700, set by
    # the host), so its files need no mode of their own; what a query writes into
    # /sandbox/work (COPY ... TO) is for the scripts' group to read and delete.
    os.umask(0o007)
    con = duckdb.connect(DATABASE)
    # No temporary directory: DuckDB may write any file under its own (COPY ... TO there
    # too), and its default (<database>.tmp) is on the host's disk, past every cap. So a
    # query past DuckDB's memory limit fails with its out-of-memory error instead of
    # spilling, and what SQL writes goes only under /sandbox/work, a size-capped tmpfs.
    con.execute("SET temp_directory=''")
    con.execute(f"SET allowed_directories=['{OFFLOAD}/', '{WORK}/']")
    con.execute("SET enable_external_access=false")
    con.execute("SET autoinstall_known_extensions=false")
    con.execute("SET autoload_known_extensions=false")
    con.execute(f"SET threads={max(os.cpu_count() or 1, 1)}")
    con.execute(f"SET checkpoint_threshold='{WAL_BYTES}'")
    con.execute("SET lock_configuration=true")
    con.execute(f"CREATE TABLE IF NOT EXISTS {LOADED} (name VARCHAR PRIMARY KEY, stamp VARCHAR)")
    drop_deleted(con)
    loader = Loader()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{SOCKET}.{os.getpid()}"
    if os.path.exists(staging):
        os.unlink(staging)
    listener.bind(staging)
    listener.listen(64)
    os.rename(staging, SOCKET)  # a relay connects only to an engine that listens
    ours = os.stat(SOCKET).st_ino
    listener.settimeout(CHECK_SECONDS)
    while True:
        try:
            client, _ = listener.accept()
        except TimeoutError:
            try:
                if os.stat(SOCKET).st_ino == ours:
                    continue
            except OSError:
                pass
            return  # the cache was cleared or another engine took over: nobody can reach us
        client.settimeout(None)
        threading.Thread(target=answer, args=(con.cursor(), client, loader), daemon=True).start()


def answer(cursor: DuckDBPyConnection, client: socket.socket, loader: Loader) -> None:
    """Answer one relay's requests, in order, on its own connection."""
    with client:
        try:
            for line in client.makefile("rb"):
                try:
                    response = run(cursor, loader, json.loads(line))
                except (ValueError, KeyError, TypeError) as e:
                    response = {"exit_code": 2, "stdout": "", "stderr": f"bad request: {e}"}
                response["pid"] = os.getpid()
                client.sendall((json.dumps(response) + "\n").encode("utf-8"))
        except OSError:
            pass  # the relay went away (its host process ended): its query is moot
        finally:
            cursor.close()


class Loader:
    """Loads each artifact a query names as a table, once per task: a query that needs an
    artifact being loaded waits for that load, not for the loads of others.

    A JSON object is loaded in two parts, its records tables first (WRAPPED_RECORDS, what
    the notice's hints query) and then its own one-row table (WHOLE), from one parse: a
    query over its records waits only for the first, the slower one-row table loading
    after it has answered."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._preloading = False
        self._wanted = False

    def load(self, cursor: DuckDBPyConnection, sql: str, wait: float = -1) -> list[str]:
        """Load what sql names (by artifact id) and is not loaded yet; return load errors.
        Raises TimeoutError if an artifact it names is still loading after wait seconds."""
        named = [
            (stem, name, ext, parts_named(sql, stem, name, ext))
            for stem, name, ext in _table_files()
            if stem in sql
        ]
        return self._load_each(cursor, named, wait)

    def preload(self, cursor: DuckDBPyConnection) -> None:
        """Load every artifact not loaded yet, newest first, in a thread of its own (one at
        a time: asked again while it runs, it runs once more); cursor is its own."""
        with self._guard:
            self._wanted = True
            if self._preloading:
                cursor.close()
                return
            self._preloading = True
        threading.Thread(target=self._preload, args=(cursor,), daemon=True).start()

    def _preload(self, cursor: DuckDBPyConnection) -> None:
        with cursor:
            while True:
                with self._guard:
                    if not self._wanted:
                        self._preloading = False
                        return
                    self._wanted = False
                files = [
                    (stem, name, ext, parts_named(None, stem, name, ext))
                    for stem, name, ext in _table_files(newest_first=True)
                ]
                # Its errors are the business of the query that names the artifact: its own
                # load tries again and reports them.
                self._load_each(cursor, files, -1)
                checkpoint(cursor)

    def _load_each(
        self,
        cursor: DuckDBPyConnection,
        files: list[tuple[str, str, str, tuple[str, ...]]],
        wait: float,
    ) -> list[str]:
        import duckdb

        errors = []
        deadline = time.monotonic() + wait
        for stem, name, ext, parts in files:
            parsed = None  # the stamp of the file the cursor's PARSED table holds
            try:
                for part in parts:
                    with self._guard:
                        lock = self._locks.setdefault(stem + part, threading.Lock())
                    timeout = max(deadline - time.monotonic(), 0) if wait >= 0 else -1
                    if not lock.acquire(timeout=timeout):
                        raise TimeoutError(f"artifact {stem} was still loading as a table")
                    try:
                        parsed = self._load(cursor, stem, name, ext, part, parsed)
                    finally:
                        lock.release()
            except duckdb.InterruptException:
                raise  # past the query's timeout: reported as such
            except duckdb.Error as e:
                errors.append(f"artifact {stem} could not be loaded as a table: {e}")
            except FileNotFoundError:
                pass  # deleted since it was listed: the query says what is missing
            finally:
                if parsed is not None:
                    cursor.execute(f"DROP TABLE IF EXISTS {PARSED}")
        return errors

    def _load(
        self,
        cursor: DuckDBPyConnection,
        stem: str,
        name: str,
        ext: str,
        part: str,
        parsed: str | None,
    ) -> str | None:
        """Load one part of the artifact (WHOLE: its table; RECORDS: a JSON object's
        records tables), unless the tables hold the file as it is now. The records are
        read from the object parsed into the cursor's PARSED table, which is kept for its
        WHOLE part (from the file again if parsed, the stamp of what PARSED holds, is not
        the file's now); returns what PARSED holds after.

        A file that grows (a task's history, appended to in place by the host) is loaded
        again when its size or time changes; a load during which it changed is done again,
        so a table never holds half of an append."""
        path = os.path.join(OFFLOAD, name)
        for attempt in range(LOAD_ATTEMPTS):
            info = whole_lines(path, ext)
            stamp = f"{info.st_size}:{info.st_mtime_ns}"
            found = cursor.execute(
                f"SELECT stamp FROM {LOADED} WHERE name = ?", [stem + part]
            ).fetchone()
            if found is not None and found[0] == stamp:
                return parsed
            # A JSON document is one object to DuckDB: records wrapped in an envelope are as
            # large as the whole file, so the bound is the file's size (64 MiB at least).
            size = max(MIN_OBJECT_SIZE, info.st_size + 1)
            reader = READERS[ext].format(path=path.replace("'", "''"), size=size)
            cursor.execute("BEGIN TRANSACTION")
            try:
                drop_tables(cursor, stem, (part,))
                if part == RECORDS:
                    cursor.execute(
                        f"CREATE OR REPLACE TEMP TABLE {PARSED} AS SELECT * FROM {reader}"
                    )
                    create_records_tables(cursor, stem)
                else:
                    source = PARSED if parsed == stamp else reader
                    cursor.execute(f"CREATE TABLE {quote(stem)} AS SELECT * FROM {source}")
                cursor.execute(
                    f"INSERT OR REPLACE INTO {LOADED} VALUES (?, ?)", [stem + part, stamp]
                )
                after = os.stat(path)
                if (after.st_size, after.st_mtime_ns) != (info.st_size, info.st_mtime_ns):
                    if attempt + 1 < LOAD_ATTEMPTS:
                        cursor.execute("ROLLBACK")
                        continue  # appended to while it loaded: load what it is now
                cursor.execute("COMMIT")
                return stamp if part == RECORDS else parsed
            except BaseException:
                cursor.execute("ROLLBACK")
                raise
        return parsed


def parts_named(sql: str | None, stem: str, name: str, ext: str) -> tuple[str, ...]:
    """The parts of an artifact to load for sql (which names its id; None: a preload, all
    of them): a JSON object's records tables if it names "stem/...", its own table if it
    names the id otherwise (or may: "c1" in "c10" counts, and makes the query wait for more
    than it needs, never less). Only such a query reads the file's head, to see whether it
    holds an object: a loaded table answers even once its file cannot be read."""
    records = ext == "json" and (sql is None or f"{stem}/" in sql)
    if not records or not _is_object(name):
        return (WHOLE,)
    if sql is None or re.search(re.escape(stem) + "(?!/)", sql):
        return (RECORDS, WHOLE)
    return (RECORDS,)


def checkpoint(cursor: DuckDBPyConnection) -> None:
    """Write what the loads left in the log into the tables file, once no query holds an
    older view of them (or leave it to the next time)."""
    import duckdb

    for _ in range(CHECKPOINT_ATTEMPTS):
        try:
            cursor.execute("CHECKPOINT")
            return
        except duckdb.TransactionException:
            time.sleep(CHECKPOINT_PAUSE)


def create_records_tables(cursor: DuckDBPyConnection, stem: str) -> None:
    """A table of each array of records the JSON object in PARSED holds (named by
    records_table)."""
    table = cursor.table(PARSED)
    for path_keys in record_arrays(list(zip(table.columns, table.dtypes, strict=True))):
        cursor.execute(
            f"CREATE TABLE {quote(records_table(stem, path_keys))} AS "
            f"SELECT unnest({field(path_keys)}, max_depth := 2) FROM {PARSED}"
        )


def whole_lines(path: str, ext: str) -> os.stat_result:
    """The file's stat, once an NDJSON file ends a line: one the host is appending to
    ends mid-line only while its write is under way (the kernel shows it page by page).
    An NDJSON file that never ends a line (its last record has no newline) is taken as it
    is after SETTLE_SECONDS without change."""
    info = os.stat(path)
    if ext != "ndjson":
        return info
    settled = time.monotonic()
    while not ends_line(path, info.st_size) and time.monotonic() - settled < SETTLE_SECONDS:
        time.sleep(SETTLE_SECONDS / 50)
        later = os.stat(path)
        if (later.st_size, later.st_mtime_ns) != (info.st_size, info.st_mtime_ns):
            info, settled = later, time.monotonic()
    return info


def ends_line(path: str, size: int) -> bool:
    if size == 0:
        return True
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1) == b"\n"


def _table_files(newest_first: bool = False) -> list[tuple[str, str, str]]:
    """The offloaded files the engine loads as tables: (artifact id, file name, extension)."""
    found = []
    for name in os.listdir(OFFLOAD):
        stem, _, ext = name.rpartition(".")
        if ext in READERS:
            found.append((stem, name, ext))
    if not newest_first:
        return sorted(found)
    return sorted(found, key=lambda file: _modified(file[1]), reverse=True)


def _modified(name: str) -> int:
    try:
        return os.stat(os.path.join(OFFLOAD, name)).st_mtime_ns
    except FileNotFoundError:
        return 0  # deleted since it was listed: its load finds it gone


def _is_object(name: str) -> bool:
    """Whether a JSON payload is one object (its table one row, whose arrays of objects get
    tables of their own), not an array (whose arrays stay in its rows). One that cannot be
    read counts as an object: its parts are loaded already, or their load says why not."""
    try:
        with open(os.path.join(OFFLOAD, name), "rb") as payload:
            return payload.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")[:1] == b"{"
    except OSError:
        return True


def drop_tables(
    cursor: DuckDBPyConnection, stem: str, parts: tuple[str, ...] = (WHOLE, RECORDS)
) -> None:
    """Drop an artifact's table (WHOLE) or its records tables (RECORDS: "stem/..." names,
    no artifact id holds a "/"), and forget that they were loaded."""
    for part in parts:
        if part == WHOLE:
            found = cursor.execute(
                "SELECT table_name FROM duckdb_tables() WHERE table_name = ?", [stem]
            ).fetchall()
        else:
            found = cursor.execute(
                "SELECT table_name FROM duckdb_tables() WHERE starts_with(table_name, ?)",
                [f"{stem}/"],
            ).fetchall()
        for (table,) in found:
            cursor.execute(f"DROP TABLE {quote(table)}")
        cursor.execute(f"DELETE FROM {LOADED} WHERE name = ?", [stem + part])


def drop_deleted(cursor: DuckDBPyConnection) -> None:
    """Drop the tables of artifacts whose payload is gone: deleting one stops the engine and
    then deletes its cache, and an engine started in between must not serve its tables."""
    present = {stem for stem, _, _ in _table_files()}
    for (loaded,) in cursor.execute(f"SELECT name FROM {LOADED}").fetchall():
        stem = loaded.removesuffix(RECORDS)
        if stem not in present:
            drop_tables(cursor, stem)


def record_arrays(
    columns: list[tuple[str, Any]], path: tuple[str, ...] = ()
) -> list[tuple[str, ...]]:
    """The key paths of the arrays of objects among columns (name, DuckDB type), looking
    into objects up to RECORDS_MAX_DEPTH keys deep."""
    found: list[tuple[str, ...]] = []
    for key, kind in columns:
        here = (*path, key)
        if kind.id == "list" and kind.children[0][1].id == "struct":
            found.append(here)
        elif kind.id == "struct" and len(here) < RECORDS_MAX_DEPTH:
            found.extend(record_arrays(list(kind.children), here))
    return found


def records_table(stem: str, path: tuple[str, ...]) -> str:
    """The records table's name: the artifact's id, "/", the path as the host's notice
    writes it (spillbox.profile.path_text: a key that is not a plain name JSON-quoted in
    brackets, so the name is printable ASCII whatever the keys hold)."""
    parts = [
        ("." if index else "") + key if PLAIN_KEY.fullmatch(key) else f"[{json.dumps(key)}]"
        for index, key in enumerate(path)
    ]
    return f"{stem}/{''.join(parts)}"


def field(path: tuple[str, ...]) -> str:
    """The SQL expression of the value at path in an artifact's one-row table."""
    first, *rest = path
    return quote(first) + "".join("['" + key.replace("'", "''") + "']" for key in rest)


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def cell(value: object) -> object:
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str, ensure_ascii=False)
    return value


def check(cursor: DuckDBPyConnection, sql: str) -> None:
    """Refuse a query with a statement that can only write (Refused says which)."""
    for statement in cursor.extract_statements(sql):
        kind = statement.type.name
        if kind == "EXPLAIN":
            inner = re.sub(r"(?is)^\s*explain\s+(analy[sz]e\s+)?", "", statement.query)
            if inner != statement.query:
                check(cursor, inner)
                continue
        if kind not in READING_STATEMENTS:
            raise Refused(
                f"{kind} statements are refused: SQL here only reads, and artifact tables "
                "cannot be changed. Use WITH ... AS (...) for intermediate results, COPY "
                "(SELECT ...) TO '/sandbox/work/x.parquet' to keep one, or python (duckdb) "
                "for scratch tables"
            )


def rewrite_paths(cursor: DuckDBPyConnection, sql: str) -> str:
    """sql with every read of an offloaded file by its path replaced by the artifact's
    table, where the table holds exactly what that read returns."""
    if f"{OFFLOAD}/" not in sql:
        return sql
    found = cursor.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    tree = json.loads(found[0])
    if tree.get("error"):
        return sql  # not only SELECTs: run as written
    edits: list[tuple[int, int, str]] = []
    _collect_edits(tree, edits)
    if not edits:
        return sql
    data = sql.encode("utf-8")
    for start, length, text in sorted(edits, reverse=True):
        data = data[:start] + text.encode("utf-8") + data[start + length :]
    return data.decode("utf-8")


def _collect_edits(node: object, edits: list[tuple[int, int, str]]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect_edits(item, edits)
        return
    if not isinstance(node, dict):
        return
    edit = _table_for(node)
    if edit is not None:
        edits.append(edit)
        return
    for value in node.values():
        _collect_edits(value, edits)


def _table_for(node: dict[str, object]) -> tuple[int, int, str] | None:
    """The edit that turns this FROM item into its artifact's table, if it is a plain read
    of an offloaded file: (byte offset, byte length, replacement)."""
    kind = node.get("type")
    start, length = node.get("query_location"), node.get("query_location_length")
    if kind not in ("TABLE_FUNCTION", "BASE_TABLE") or start in (None, NOWHERE) or not length:
        return None
    alias = str(node.get("alias") or "")
    if kind == "BASE_TABLE":
        if node.get("schema_name") or node.get("catalog_name"):
            return None
        table = _artifact_table(str(node.get("table_name")), None)
        default_alias = None
    else:
        function = node.get("function")
        if not isinstance(function, dict):
            return None
        name = str(function.get("function_name"))
        path = None
        for argument in function.get("arguments") or []:
            expression = argument.get("expression") or {}
            literal = expression.get("literal") or {}
            if not argument.get("name") and path is None and literal.get("kind") == "STRING":
                path = str(literal.get("text"))
            elif argument.get("name") not in SAME_AS_TABLE_OPTIONS:
                return None
        if path is None:
            return None
        table = _artifact_table(path, name)
        default_alias = name  # what the columns were qualified by: keep it
    if table is None:
        return None
    alias = alias or default_alias or ""
    return int(start), int(length), quote(table) + (f" AS {quote(alias)}" if alias else "")


def _artifact_table(path: str, function: str | None) -> str | None:
    """The table of the artifact at path, if `function` (None: the path as a table) reads
    it as the table holds it."""
    folder, _, name = path.rpartition("/")
    stem, _, ext = name.rpartition(".")
    if folder != OFFLOAD or ext not in READERS or not os.path.isfile(path):
        return None
    if function is not None and function not in PATH_READERS[ext]:
        return None
    return stem


def run(
    cursor: DuckDBPyConnection, loader: Loader, request: dict[str, object]
) -> dict[str, object]:
    import duckdb

    if request.get("preload"):
        loader.preload(cursor.cursor())
        return {"exit_code": 0, "stdout": "", "stderr": "", "timed_out": False, "truncated": False}
    sql = str(request["sql"])
    max_bytes = int(request.get("max_bytes", 32 * 1024 * 1024))
    timeout = float(request.get("timeout", 30))
    timer = threading.Timer(timeout, cursor.interrupt)
    stdout, stderr = "", []
    exit_code, timed_out, truncated = 0, False, False
    timer.start()
    try:
        check(cursor, sql)
        sql = rewrite_paths(cursor, sql)
        stderr.extend(loader.load(cursor, sql, wait=timeout))
        cursor.execute("BEGIN TRANSACTION")
        try:
            stdout, truncated = as_csv(cursor.execute(sql), max_bytes)
        finally:
            timer.cancel()
            cursor.execute("ROLLBACK")
        if truncated:
            stderr.append(f"output over {max_bytes} bytes was cut: aggregate, filter or add LIMIT")
    except Refused as e:
        exit_code = 1
        stderr.append(str(e))
    except duckdb.InterruptException:
        exit_code, timed_out = 124, True
        stderr.append("query interrupted: it ran past its timeout")
    except TimeoutError as e:  # waiting for a load another query or the preload began
        exit_code, timed_out = 124, True
        stderr.append(f"query interrupted: it ran past its timeout ({e})")
    except duckdb.Error as e:
        exit_code = 1
        stderr.append(str(e))
    finally:
        timer.cancel()
    return {
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": "\n".join(stderr),
        "timed_out": timed_out,
        "truncated": truncated,
    }


def as_csv(result: DuckDBPyConnection, max_bytes: int) -> tuple[str, bool]:
    """A result's rows as CSV with a header, and whether they were cut past max_bytes."""
    out = io.StringIO()
    if result.description:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([column[0] for column in result.description])
        while rows := result.fetchmany(FETCH_ROWS):
            writer.writerows([cell(v) for v in row] for row in rows)
            if out.tell() > max_bytes:
                return out.getvalue(), True
    return out.getvalue(), False


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit(relay())
