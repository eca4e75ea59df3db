"""The task's SQL engine: one long-lived DuckDB process inside the sandbox.

Runs as its own uid (not the scripts' uid, so scripts cannot signal or ptrace it) and
answers one JSON request per stdin line with one JSON line on stdout. It stays up
between queries, so a payload is parsed once into a table in /sandbox/cache and every
later query answers from that table in milliseconds, instead of re-parsing the JSON
(400 ms for 40 MB) and re-importing duckdb (260 ms) each time.

Request:  {"sql": "...", "timeout": 30, "max_bytes": 33554432}
Response: {"exit_code": 0, "stdout": "csv...", "stderr": "", "timed_out": false,
           "truncated": false, "pid": 123}

Model-written SQL is hostile: file access is limited to /sandbox/offload (read) and
/sandbox/work, and the configuration is locked before any request runs.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import threading

import duckdb

OFFLOAD = "/sandbox/offload"
WORK = "/sandbox/work"
DATABASE = "/sandbox/cache/tables.duckdb"
LOADED = "_spillbox_loaded"
READERS = {
    "json": "read_json_auto('{path}', maximum_object_size=67108864)",
    "ndjson": "read_json_auto('{path}', format='newline_delimited')",
    "csv": "read_csv_auto('{path}')",
}
FETCH_ROWS = 2048


def connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(DATABASE)
    con.execute(f"SET allowed_directories=['{OFFLOAD}/', '{WORK}/']")
    con.execute("SET enable_external_access=false")
    con.execute("SET autoinstall_known_extensions=false")
    con.execute("SET autoload_known_extensions=false")
    con.execute(f"SET threads={max(os.cpu_count() or 1, 1)}")
    con.execute("SET lock_configuration=true")
    con.execute(f"CREATE TABLE IF NOT EXISTS {LOADED} (name VARCHAR PRIMARY KEY, stamp VARCHAR)")
    return con


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def load_tables(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    """Load each artifact the query names (by id) as a table, once; return load errors."""
    errors = []
    loaded = dict(con.execute(f"SELECT name, stamp FROM {LOADED}").fetchall())
    for name in sorted(os.listdir(OFFLOAD)):
        stem, _, ext = name.rpartition(".")
        if ext not in READERS or stem not in sql:
            continue
        info = os.stat(os.path.join(OFFLOAD, name))
        stamp = f"{info.st_size}:{info.st_mtime_ns}"
        if loaded.get(stem) == stamp:
            continue
        reader = READERS[ext].format(path=os.path.join(OFFLOAD, name).replace("'", "''"))
        try:
            con.execute(f"CREATE OR REPLACE TABLE {quote(stem)} AS SELECT * FROM {reader}")
            con.execute(f"INSERT OR REPLACE INTO {LOADED} VALUES (?, ?)", [stem, stamp])
        except duckdb.Error as e:
            errors.append(f"artifact {stem} could not be loaded as a table: {e}")
    return errors


def cell(value: object) -> object:
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str, ensure_ascii=False)
    return value


def run(con: duckdb.DuckDBPyConnection, request: dict[str, object]) -> dict[str, object]:
    sql = str(request["sql"])
    max_bytes = int(request.get("max_bytes", 32 * 1024 * 1024))  # type: ignore[call-overload]
    timer = threading.Timer(float(request.get("timeout", 30)), con.interrupt)  # type: ignore[arg-type]
    out = io.StringIO()
    stderr: list[str] = []
    exit_code, timed_out, truncated = 0, False, False
    timer.start()
    try:
        stderr.extend(load_tables(con, sql))
        result = con.execute(sql)
        if result.description:
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow([column[0] for column in result.description])
            while rows := result.fetchmany(FETCH_ROWS):
                writer.writerows([cell(v) for v in row] for row in rows)
                if out.tell() > max_bytes:
                    truncated = True
                    stderr.append(
                        f"output over {max_bytes} bytes was cut: aggregate, filter or add LIMIT"
                    )
                    break
    except duckdb.InterruptException:
        exit_code, timed_out = 124, True
        stderr.append("query interrupted: it ran past its timeout")
    except duckdb.Error as e:
        exit_code = 1
        stderr.append(str(e))
    finally:
        timer.cancel()
    return {
        "exit_code": exit_code,
        "stdout": out.getvalue(),
        "stderr": "\n".join(stderr),
        "timed_out": timed_out,
        "truncated": truncated,
        "pid": os.getpid(),
    }


def main() -> None:
    con = connect()
    for line in sys.stdin:
        try:
            response = run(con, json.loads(line))
        except (ValueError, KeyError, TypeError) as e:
            response = {
                "exit_code": 2,
                "stdout": "",
                "stderr": f"bad request: {e}",
                "pid": os.getpid(),
            }
        sys.stdout.write(json.dumps(response) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
