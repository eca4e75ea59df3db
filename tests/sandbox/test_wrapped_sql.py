"""SQL over records wrapped in an object (issue 24 item 5), under runc and gVisor: the table
of the records ("c1/items") that the notice's SQL hint queries holds what the same records
stored as a bare array do, row for row; a query sent right after the offload, while the
engine loads the tables in the background, answers whole; a deleted artifact's tables are
gone and are not loaded again; and records under hostile keys get a working hint or none
that runs, never SQL of the payload's making."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import test_session_channel

from api_shapes import SHAPES, github_search
from spillbox import Harness, Task, ToolResult, codemode, parse_notice

pytestmark = pytest.mark.docker

harness = test_session_channel.harness
"""A docker harness under runc and again under gVisor, shared by the module's tests."""

LOAD_ROOM_SECONDS = 120.0
"""How long the background load may take to show its tables: seconds on a quiet machine,
far more beside other test workers on 2 cores."""


@pytest.fixture(scope="module")
def task(harness: Harness) -> Iterator[Task]:
    """One task for the module's tests: each uses artifact ids of its own."""
    task = harness.task("wrapped-sql")
    yield task
    task.close(delete=True)


def offload(task: Task, call_id: str, value: Any) -> dict[str, str]:
    [admitted] = task.admit([ToolResult(call_id=call_id, tool="api", content=json.dumps(value))])
    fields = parse_notice(admitted.text)
    assert admitted.offloaded and fields is not None, admitted.text
    return fields


def sql(task: Task, query: str) -> str:
    result = task.exec("sql", query, timeout=120)
    assert result.exit_code == 0, (query, result.stderr)
    if result.artifact is not None:  # a whole table's rows: offloaded, read back
        return task.read(result.artifact.id).decode("utf-8")
    return result.text


def sql_hint(fields: dict[str, str]) -> str:
    [hint] = [line for line in fields["hint"].splitlines() if line.startswith("sql: ")]
    return hint.removeprefix("sql: ")


def tables(task: Task) -> list[str]:
    """The engine's tables; the query names no artifact, so it loads none."""
    query = "SELECT table_name FROM duckdb_tables() WHERE table_name[1] <> '_' ORDER BY 1"
    return sql(task, query).splitlines()[1:]


def at(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def test_the_records_hint_answers_as_the_same_records_in_a_bare_array_do(task: Task) -> None:
    for index, (name, (builder, path, _)) in enumerate(SHAPES.items()):
        value = builder(300, seed=index)
        fields = offload(task, f"w{index}", value)
        offload(task, f"b{index}", at(value, path))
        hint = sql_hint(fields)
        table = codemode.records_table(f"w{index}", path)
        assert hint == f"SELECT * FROM {table} LIMIT 5", name
        assert sql(task, hint) == sql(task, f'SELECT * FROM "b{index}" LIMIT 5'), name
        # Every row, in the records' order, and every column of the same type.
        assert sql(task, f"SELECT * FROM {table}") == sql(task, f'SELECT * FROM "b{index}"')
        described = f"SELECT column_name, column_type FROM (DESCRIBE {table})"
        assert sql(task, described) == sql(task, described.replace(table, f'"b{index}"'))
        # The object's own table is still its one row; arrays inside the records of a bare
        # array (GitHub's labels) stay in their rows, with no table of their own.
        assert sql(task, f'SELECT count(*) AS n FROM "w{index}"').splitlines() == ["n", "1"]
        assert [t for t in tables(task) if t.startswith(f"b{index}/")] == [], name


def test_a_query_sent_right_after_the_offload_answers_whole(task: Task) -> None:
    # Large enough that its load takes a while: the query comes while the engine is loading
    # it in the background (or before it began), and waits for the whole table.
    value = github_search(20_000, seed=7)
    task.exec("sh", "true")  # the sandbox is up: the offload's preload starts at once
    offload(task, "big", value)
    counted = sql(task, 'SELECT count(*) AS n, max(id) AS top FROM "big/items"')
    assert counted.splitlines() == ["n,top", f"20000,{1_000_000 + 19_999}"]
    offload(task, "more", github_search(5_000, seed=8))
    assert sql(task, 'SELECT count(*) AS n FROM "more"').splitlines() == ["n", "1"]
    assert sql(task, 'SELECT count(*) AS n FROM "more/items"').splitlines() == ["n", "5000"]


def test_tables_load_in_the_background_after_the_offload(task: Task, harness: Harness) -> None:
    offload(task, "early", github_search(500, seed=9))
    if harness.backend.options.gvisor:  # no background load there (DockerBackend.warm)
        assert "early/items" not in tables(task)
        assert sql(task, 'SELECT count(*) AS n FROM "early/items"').splitlines() == ["n", "500"]
        return
    loaded_in_background(task, "early")
    offload(task, "second", github_search(300, seed=13))  # wakes the thread the first started
    loaded_in_background(task, "second")


def loaded_in_background(task: Task, name: str) -> None:
    deadline = time.monotonic() + LOAD_ROOM_SECONDS
    while not {name, f"{name}/items"} <= set(tables(task)):
        assert time.monotonic() < deadline, (
            f"the background load did not show {name} and {name}/items within "
            f"{LOAD_ROOM_SECONDS:.0f} s (room for a loaded machine)"
        )


def test_a_deleted_artifacts_tables_are_gone_and_not_loaded_again(task: Task) -> None:
    offload(task, "gone", github_search(500, seed=10))
    offload(task, "kept", github_search(500, seed=11))
    assert sql(task, 'SELECT count(*) AS n FROM "gone/items"').splitlines() == ["n", "500"]
    assert sql(task, 'SELECT count(*) AS n FROM "kept/items"').splitlines() == ["n", "500"]
    task.delete("gone")
    assert [name for name in tables(task) if name.startswith("gone")] == []
    missing = task.exec("sql", 'SELECT count(*) FROM "gone/items"', timeout=120)
    assert missing.exit_code != 0 and "gone/items" in missing.stderr, missing.stderr
    # A later offload has the engine load what is there: never the deleted one.
    offload(task, "later", github_search(500, seed=12))
    assert sql(task, 'SELECT count(*) AS n FROM "later/items"').splitlines() == ["n", "500"]
    assert sql(task, 'SELECT count(*) AS n FROM "kept"').splitlines() == ["n", "1"]
    assert [name for name in tables(task) if name.startswith("gone")] == []


CANARY = "/sandbox/work/pwned.csv"
HOSTILE_PATHS = {
    # name: (the records' path, whether a hint over the records fits the notice)
    "100,000 characters": (("k" * 100_000,), False),
    "line breaks and quotes": (("a\nb\u2028c\"d'e",), True),
    "a path out": (("../x",), True),
    "breaks out of a name": ((f"x\" AS SELECT 1; COPY (SELECT 1) TO '{CANARY}'; --",), True),
    "breaks out of a field": (("data", f"x'] , 1); COPY (SELECT 1) TO '{CANARY}'; --"), True),
}


def test_records_under_hostile_keys_get_a_working_hint_and_no_sql_of_their_own(
    task: Task,
) -> None:
    records = [{"id": i, "title": f"record {i} " * 4} for i in range(400)]  # offloaded
    offload(task, "bare", records)
    for index, (name, (path, fits)) in enumerate(HOSTILE_PATHS.items()):
        value: dict[str, Any] = {"total": len(records)}
        inner = value
        for key in path[:-1]:
            inner = inner.setdefault(key, {"count": len(records)})
        inner[path[-1]] = records
        fields = offload(task, f"h{index}", value)
        hint = sql_hint(fields)
        table = codemode.records_table(f"h{index}", path)
        if fits:
            assert hint == f"SELECT * FROM {table} LIMIT 5", name
            assert sql(task, hint) == sql(task, 'SELECT * FROM "bare" LIMIT 5'), name
        else:  # no hint over the records fits: the object's own table, described
            assert hint == f'DESCRIBE "h{index}"', name
            assert sql(task, hint).splitlines()[1].startswith("total,"), name
        # The records' table holds them whatever its name holds, and loading it ran no SQL
        # of the key's making.
        assert sql(task, f"SELECT * FROM {table}") == sql(task, 'SELECT * FROM "bare"')
    canary = task.exec("sh", f"test ! -e {CANARY}", timeout=60)
    assert canary.exit_code == 0, "a key's SQL ran in the engine"
