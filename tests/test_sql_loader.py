"""The sandbox's SQL engine loader (sqlserver.py, run here on the host's DuckDB, the same
version the image pins) loads a JSON object in two parts: its records tables first, what the
notice's hints query, then its own one-row table, both from one parse. A query over the
records waits for the first part only; one that names the artifact itself waits for both;
what each part holds is what DuckDB reads from the file; a deleted artifact's parts are
dropped; and the checkpoint that follows a preload gives way to a query that still reads."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import duckdb
import pytest

RUNTIME = Path(__file__).parent.parent / "sandbox_images/sandbox/runtime"

PAYLOAD = {
    "total_count": 3,
    "incomplete_results": False,
    "items": [{"id": n, "title": f"pr {n}", "user": {"login": f"u{n}"}} for n in range(3)],
    "meta": {"page": {"rows": [{"k": "a"}, {"k": "b"}]}},
}


@pytest.fixture
def sqlserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(RUNTIME))
    import sqlserver

    offload = tmp_path / "offload"
    offload.mkdir()
    monkeypatch.setattr(sqlserver, "OFFLOAD", str(offload))
    (offload / "c1.json").write_text(json.dumps(PAYLOAD))
    (offload / "c2.json").write_text(json.dumps(PAYLOAD["items"]))
    return sqlserver


@pytest.fixture
def engine(tmp_path: Path, sqlserver: ModuleType) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(str(tmp_path / "tables.duckdb"))
    con.execute(f"CREATE TABLE {sqlserver.LOADED} (name VARCHAR PRIMARY KEY, stamp VARCHAR)")
    yield con
    con.close()


def tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    found = con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()
    return [name for (name,) in found if not name.startswith("_")]


def read(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple[object, ...]]:
    return con.execute(query).fetchall()


def test_a_query_over_records_loads_the_records_alone(
    sqlserver: ModuleType, engine: duckdb.DuckDBPyConnection
) -> None:
    loader = sqlserver.Loader()
    assert loader.load(engine.cursor(), 'SELECT count(*) FROM "c1/items"') == []
    assert tables(engine) == ["c1/items", "c1/meta.page.rows"]
    assert read(engine, 'SELECT id, title, "user".login FROM "c1/items" ORDER BY id') == [
        (n, f"pr {n}", f"u{n}") for n in range(3)
    ]
    # The parse it was read from is gone with the load: nothing stays in memory.
    assert read(engine, "SELECT count(*) FROM duckdb_tables() WHERE temporary") == [(0,)]

    assert loader.load(engine.cursor(), "SELECT total_count FROM c1") == []
    assert tables(engine) == ["c1", "c1/items", "c1/meta.page.rows"]
    path = Path(sqlserver.OFFLOAD) / "c1.json"
    assert read(engine, "SELECT * FROM c1") == read(
        engine, f"SELECT * FROM read_json_auto('{path}')"
    )


def test_a_preload_makes_both_parts_from_one_parse(
    sqlserver: ModuleType, engine: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    readers: list[str] = []
    execute = duckdb.DuckDBPyConnection.execute

    class Counting:
        """A cursor that notes each statement reading the payload file."""

        def __init__(self, cursor: duckdb.DuckDBPyConnection) -> None:
            self.cursor = cursor

        def execute(self, sql: str, *args: object) -> duckdb.DuckDBPyConnection:
            if "read_json_auto(" in sql:
                readers.append(sql)
            return execute(self.cursor, sql, *args)

        def __getattr__(self, name: str) -> object:
            return getattr(self.cursor, name)

    loader = sqlserver.Loader()
    files = [("c1", "c1.json", "json", (sqlserver.RECORDS, sqlserver.WHOLE))]
    assert loader._load_each(Counting(engine.cursor()), files, -1) == []
    assert len(readers) == 1, readers
    assert tables(engine) == ["c1", "c1/items", "c1/meta.page.rows"]
    assert read(engine, 'SELECT count(*) FROM "c1/items"') == [(3,)]
    assert read(engine, "SELECT count(*) FROM duckdb_tables() WHERE temporary") == [(0,)]
    loaded = read(engine, f"SELECT name FROM {sqlserver.LOADED} ORDER BY 1")
    assert loaded == [("c1",), ("c1/",)]


def test_a_records_query_does_not_wait_for_the_object_s_own_table(
    sqlserver: ModuleType, engine: duckdb.DuckDBPyConnection
) -> None:
    """The one-row table loading (its lock held, as by a preload making it) holds up a query
    that names the artifact, never one over its records."""
    loader = sqlserver.Loader()
    loader.load(engine.cursor(), 'SELECT 1 FROM "c1/items"')
    whole = loader._locks.setdefault("c1", threading.Lock())
    with whole:
        assert loader.load(engine.cursor(), 'SELECT count(*) FROM "c1/items"', wait=5) == []
        with pytest.raises(TimeoutError, match="artifact c1 was still loading"):
            loader.load(engine.cursor(), "SELECT * FROM c1", wait=0.05)
        with pytest.raises(TimeoutError):  # "c1" alone, beside its records, still counts
            loader.load(engine.cursor(), 'SELECT * FROM "c1/items", c1', wait=0.05)


def test_an_array_is_one_part_whatever_the_query_writes(
    sqlserver: ModuleType, engine: duckdb.DuckDBPyConnection
) -> None:
    whole, records = (sqlserver.WHOLE,), (sqlserver.RECORDS, sqlserver.WHOLE)
    assert sqlserver.parts_named('SELECT * FROM "c2/x"', "c2", "c2.json", "json") == whole
    assert sqlserver.parts_named(None, "c2", "c2.json", "json") == whole
    assert sqlserver.parts_named("SELECT * FROM c10", "c1", "c1.json", "json") == whole
    assert sqlserver.parts_named('SELECT * FROM "c10/items"', "c1", "c1.json", "json") == whole
    assert sqlserver.parts_named(None, "c1", "c1.json", "json") == records
    loader = sqlserver.Loader()
    assert loader.load(engine.cursor(), "SELECT count(*) FROM c2") == []
    assert tables(engine) == ["c2"]
    assert read(engine, "SELECT count(*) FROM c2") == [(3,)]


def test_a_deleted_object_loses_both_parts(
    sqlserver: ModuleType, engine: duckdb.DuckDBPyConnection
) -> None:
    sqlserver.Loader().load(engine.cursor(), 'SELECT * FROM "c1/items", c1')
    (Path(sqlserver.OFFLOAD) / "c1.json").unlink()
    sqlserver.drop_deleted(engine.cursor())
    assert tables(engine) == []
    assert read(engine, f"SELECT count(*) FROM {sqlserver.LOADED}") == [(0,)]


def test_a_changed_object_is_loaded_again_part_by_part(
    sqlserver: ModuleType, engine: duckdb.DuckDBPyConnection
) -> None:
    loader = sqlserver.Loader()
    loader.load(engine.cursor(), 'SELECT * FROM "c1/items", c1')
    path = Path(sqlserver.OFFLOAD) / "c1.json"
    path.write_text(json.dumps({**PAYLOAD, "items": PAYLOAD["items"][:1], "total_count": 1}))
    loader.load(engine.cursor(), 'SELECT * FROM "c1/items"')
    assert read(engine, 'SELECT count(*) FROM "c1/items"') == [(1,)]
    assert read(engine, "SELECT total_count FROM c1") == [(3,)]  # not asked for yet
    loader.load(engine.cursor(), "SELECT total_count FROM c1")
    assert read(engine, "SELECT total_count FROM c1") == [(1,)]


def test_the_checkpoint_gives_way_to_a_query_still_reading(
    tmp_path: Path, sqlserver: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB refuses a checkpoint while a query begun before the last load reads: the
    preload's checkpoint tries again, then leaves it, and takes it once the query ends."""
    monkeypatch.setattr(sqlserver, "CHECKPOINT_PAUSE", 0.0)
    con = duckdb.connect(str(tmp_path / "tables.duckdb"))
    con.execute(f"SET checkpoint_threshold='{sqlserver.WAL_BYTES}'")
    con.execute(f"CREATE TABLE {sqlserver.LOADED} (name VARCHAR PRIMARY KEY, stamp VARCHAR)")
    reader = con.cursor()
    reader.execute("BEGIN TRANSACTION")
    reader.execute(f"SELECT count(*) FROM {sqlserver.LOADED}").fetchall()
    sqlserver.Loader().load(con.cursor(), "SELECT * FROM c2")
    wal = tmp_path / "tables.duckdb.wal"
    assert wal.stat().st_size > 0
    sqlserver.checkpoint(con.cursor())
    assert wal.exists() and wal.stat().st_size > 0
    reader.execute("ROLLBACK")
    sqlserver.checkpoint(con.cursor())
    assert not wal.exists() or wal.stat().st_size == 0
    con.close()
