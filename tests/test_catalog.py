"""The catalog on SQLite and on Postgres: one migration history, applied once under a lock;
catalogs from before Alembic upgraded in place; several writers; clear errors; claims."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from catalog_backends import run_at_once
from spillbox import Harness
from spillbox.catalog import CATALOG_FILE, Catalog, claims, migrate
from spillbox.catalog.database import SQL_CACHE_SUFFIX, Statement
from spillbox.catalog.schema import metadata
from spillbox.config import Settings
from spillbox.errors import ConfigError, StorageError
from spillbox.types import ArtifactRow

DATA = Path(__file__).parent / "data"
OLD_TABLES = ("tasks", "artifacts", "access_log", "sqlite_sequence")


def _row(task_id: str, artifact_id: str, **changes: object) -> ArtifactRow:
    fields: dict[str, object] = {
        "task_id": task_id,
        "artifact_id": artifact_id,
        "call_id": artifact_id,
        "tool": "t",
        "name": f"{artifact_id}.json",
        "path": f"/sandbox/offload/{artifact_id}.json",
        "bytes": 10,
        "tokens": 3,
        "tokens_exact": True,
        "sha256": "0" * 64,
        "created_at": time.time(),
        "last_access_at": time.time(),
        "expires_at": None,
        "state": "live",
        "pinned": False,
        "redactions": 0,
        "deleted_at": None,
        "deleted_by": None,
    }
    fields.update(changes)
    return ArtifactRow(**fields)  # type: ignore[arg-type]


def _sql(catalog: Catalog, statement: str) -> list[tuple[object, ...]]:
    with catalog.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(statement))]


def test_migrations_are_recorded_in_the_database(home: Path, catalog_url: str | None) -> None:
    catalog = Catalog(home, url=catalog_url)
    assert catalog.migrated
    assert catalog.revision() == migrate.head() == "0008"
    assert _sql(catalog, "SELECT version_num FROM alembic_version") == [(migrate.head(),)]
    catalog.close()
    if catalog_url is None:
        with sqlite3.connect(home / CATALOG_FILE) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_the_newest_migration_file_is_alembics_head() -> None:
    assert migrate.newest_file() == migrate.head()


def test_a_catalog_at_the_newest_revision_opens_without_alembic(home: Path) -> None:
    Catalog(home).close()  # made and migrated here
    script = (
        "import sys; from pathlib import Path; from spillbox.catalog import Catalog\n"
        f"c = Catalog(Path({str(home)!r})); assert not c.migrated; c.close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_long_lived_process_migrates_in_a_child_and_never_imports_alembic(
    home: Path, catalog_url: str | None
) -> None:
    """A server's catalog (Harness(long_lived=True)) is migrated by a child process: the
    server never holds Alembic and Mako (about 24 MB of a fresh home's proxy at idle)."""
    script = (
        "import os, sys; from pathlib import Path; from spillbox.catalog import Catalog, migrate\n"
        "c = Catalog(Path(sys.argv[1]), url=os.environ['URL'] or None, migrate_apart=True)\n"
        "print(c.migrated, migrate._recorded(c.db) == migrate.newest_file(),\n"
        "      sorted({m.split('.')[0] for m in sys.modules} & {'alembic', 'mako'}))\n"
        "c.close()"
    )
    env = {**os.environ, "URL": catalog_url or ""}
    done = subprocess.run(
        [sys.executable, "-c", script, str(home)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["True", "True", "[]"]


_SESSION = """
import sys; from pathlib import Path
from spillbox import Harness, ToolResult
with Harness(sandbox="none", home=Path(sys.argv[1]), environ={}, long_lived=True) as harness:
    with harness.task("t") as task:
        call_id = task.next_call_id("git_log")
        [admitted] = task.admit([ToolResult(call_id, "git_log", "commit\\n" * 20_000)])
        assert admitted.offloaded and task.artifacts()
    harness.gc()
    harness.remove("t")
print(sorted({m.split(".")[0] for m in sys.modules} & {"sqlalchemy", "alembic"}))
"""


def test_a_server_in_a_new_home_runs_a_session_without_sqlalchemy(home: Path) -> None:
    """The child that migrates a new SQLite catalog for a server (spillbox mcp proxy) also
    compiles the statements a session runs, beside the catalog: the server's task, call
    ids, offload, listing, collection and removal then never import SQLAlchemy, which
    would stay in its memory for good (about 12 MB of a fresh home's proxy at idle)."""
    done = subprocess.run(
        [sys.executable, "-c", _SESSION, str(home)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["[]"]
    cached = json.loads((home / (CATALOG_FILE + SQL_CACHE_SUFFIX)).read_text())
    assert "insert_artifact" in " ".join(cached["statements"])


def test_a_child_that_cannot_migrate_leaves_it_to_this_process(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(home / "no-such-python"))
    catalog = Catalog(home, migrate_apart=True)
    assert catalog.migrated and catalog.revision() == migrate.head()
    catalog.close()


_EVERY_USE = """
import dataclasses, json, sys
from pathlib import Path
from spillbox.catalog import Catalog, claims
from spillbox.catalog.calls import next_call_id
from spillbox.types import ArtifactRow
catalog = Catalog(Path(sys.argv[1]))
task = sys.argv[2]
row = ArtifactRow(
    task_id=task, artifact_id="a1", call_id="c1", tool="t", name="a1.json",
    path="/sandbox/offload/a1.json", bytes=10, tokens=3, tokens_exact=True, sha256="0" * 64,
    created_at=1.0, last_access_at=1.0, expires_at=1.0, state="live", pinned=False,
    redactions=0, deleted_at=None, deleted_by=None,
)
sys.stdin.readline()
catalog.open_task(task, "{}")
assert catalog.add_artifact(row)
assert catalog.add_artifact(row)  # the same row again: recorded once
assert not catalog.add_artifact(dataclasses.replace(row, sha256="1" * 64))
catalog.accessed(task, ["a1"], None, "read", "read_artifact")
found = catalog.find(task, "a1.json")
ids = [next_call_id(catalog, task, "git_log") for _ in range(2)]
expired = [row.artifact_id for row in claims.expired(catalog, 2.0) if row.task_id == task]
claimed = [f"{row.task_id}/{row.artifact_id}" for row in claims.claim_expired(catalog, 2.0)]
assert catalog.tombstone(task, "a1", "ttl")
catalog.close_task(task, None)
assert claims.claim_task(catalog, task, 3.0)
print(json.dumps({
    "found": found.artifact_id if found else None,
    "ids": ids,
    "expired": expired,
    "claimed": claimed,
    "audit": [entry.action for entry in catalog.audit(task)],
    "tasks": [row.task_id for row in catalog.tasks(("closed",))],
    "heavy": sorted({m.split(".")[0] for m in sys.modules} & {"sqlalchemy", "alembic"}),
}))
catalog.close()
"""
_EVERY_USE_ANSWER = {
    "found": "a1",
    "ids": ["git_log_1", "git_log_2"],
    "expired": ["a1"],
    "audit": ["offload", "read", "delete"],
}


def _every_use(home: Path, tasks: list[str]) -> list[dict[str, Any]]:
    """Each task's round of the catalog's uses, each in a process of its own, all at once;
    each answer as _EVERY_USE_ANSWER says, and every task's expired artifact claimed by
    one process exactly (a collector claims the expired artifacts of every task: which
    process claims which depends on how the processes interleave)."""
    command = [sys.executable, "-c", _EVERY_USE, str(home)]
    done = run_at_once([[*command, task] for task in tasks])
    assert [(code, err) for code, _, err in done] == [(0, "")] * len(tasks)
    answers = [json.loads(out) for _, out, _ in done]
    for answer in answers:
        assert {k: answer[k] for k in _EVERY_USE_ANSWER} == _EVERY_USE_ANSWER
    claimed = sorted(claim for answer in answers for claim in answer["claimed"])
    assert claimed == sorted(f"{task}/a1" for task in tasks)
    return answers


def test_a_process_finding_its_statements_compiled_runs_without_sqlalchemy(home: Path) -> None:
    """The statements' SQL, compiled once, is kept beside the catalog: a later process
    (a CLI command) opens the catalog, offloads, reads, numbers calls, collects and
    deletes without importing SQLAlchemy (about 160 ms of its start), and gets the same
    answers as the process that compiled them."""
    Catalog(home).close()  # made and migrated (Alembic) here
    [first] = _every_use(home, ["t1"])
    assert first["heavy"] == ["sqlalchemy"]  # it compiled the statements
    [later] = _every_use(home, ["t2"])
    assert later["heavy"] == []
    assert later["tasks"] == ["t1", "t2"]
    cached = json.loads((home / (CATALOG_FILE + SQL_CACHE_SUFFIX)).read_text())
    assert len(cached["statements"]) >= 15


def test_processes_compiling_at_once_keep_one_whole_sql_cache(home: Path) -> None:
    Catalog(home).close()
    _every_use(home, [f"t{k}" for k in range(4)])
    cached = json.loads((home / (CATALOG_FILE + SQL_CACHE_SUFFIX)).read_text())
    _every_use(home, ["t9"])
    # Whatever a racing writer's rename dropped was compiled again and kept.
    assert len(
        json.loads((home / (CATALOG_FILE + SQL_CACHE_SUFFIX)).read_text())["statements"]
    ) >= len(cached["statements"])
    assert not [p.name for p in home.iterdir() if p.name.startswith(".")]  # no temporary left


@pytest.mark.parametrize("damage", ["other definitions", "not json", "not a table"])
def test_a_sql_cache_from_other_statements_or_damaged_is_compiled_again(
    home: Path, damage: str
) -> None:
    """A cache written from other statement definitions (an older spillbox: its SQL may
    name columns this one's records lack) is never run: the statements are compiled again
    and the file rewritten."""
    Catalog(home).close()
    _every_use(home, ["t1"])
    path = home / (CATALOG_FILE + SQL_CACHE_SUFFIX)
    cached = json.loads(path.read_text())
    wrong = {key: ["SELECT 1 AS wrong", {}, []] for key in cached["statements"]}
    path.write_text(
        {
            "other definitions": json.dumps({"fingerprint": "0" * 64, "statements": wrong}),
            "not json": '{"fingerprint": "' + cached["fingerprint"] + '", "stat',
            "not a table": json.dumps({"fingerprint": cached["fingerprint"], "statements": 7}),
        }[damage]
    )
    [answer] = _every_use(home, ["t2"])
    assert answer["heavy"] == ["sqlalchemy"]
    assert json.loads(path.read_text())["fingerprint"] == cached["fingerprint"]


def test_the_migrated_schema_is_the_one_the_queries_use(
    home: Path, catalog_url: str | None
) -> None:
    """One schema: the migration history leaves exactly the tables of catalog/schema.py,
    columns, types, nullability and indexes, on both databases."""
    catalog = Catalog(home, url=catalog_url)
    with catalog.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        differences = compare_metadata(context, metadata)
    assert [d for d in differences if "alembic_version" not in str(d)] == []
    catalog.close()


def test_reopening_is_idempotent_and_keeps_the_data(home: Path, catalog_url: str | None) -> None:
    catalog = Catalog(home, url=catalog_url)
    catalog.open_task("t1", "{}")
    catalog.add_artifact(_row("t1", "a1"))
    catalog.close()
    for _ in range(3):
        again = Catalog(home, url=catalog_url)
        assert not again.migrated
        assert again.revision() == migrate.head()
        assert [r.artifact_id for r in again.artifacts("t1")] == ["a1"]
        again.close()


def _old_catalog(home: Path, dump: str) -> dict[str, list[tuple[object, ...]]]:
    """A catalog file loaded from a dump of the pre-Alembic code, and its rows."""
    home.mkdir(parents=True)
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        conn.executescript((DATA / dump).read_text())
    return _old_rows(home)


def _old_rows(home: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the tables the old code made, in the columns it knew."""
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        old_columns = {
            "artifacts": "task_id, artifact_id, call_id, tool, name, path, bytes, tokens, "
            "tokens_exact, sha256, created_at, last_access_at, expires_at, state, pinned, "
            "redactions, deleted_at, deleted_by",
            "tasks": "task_id, created_at, closed_at, delete_after, retention, state, "
            "deleted_at, deleted_by",
        }
        return {
            table: conn.execute(
                f"SELECT {old_columns.get(table, '*')} FROM {table} ORDER BY rowid"
            ).fetchall()
            for table in OLD_TABLES
        }


def test_a_catalog_made_before_alembic_is_upgraded_in_place_losing_no_row(home: Path) -> None:
    before = _old_catalog(home, "catalog_named_migrations.sql")
    assert [len(before[table]) for table in ("tasks", "artifacts", "access_log")] == [3, 5, 10]
    catalog = Catalog(home)
    assert catalog.migrated and catalog.revision() == migrate.head()
    assert _old_rows(home) == before
    # The kinds the old code recorded are still there, and the claim columns are empty.
    kinds = [r.kind for r in catalog.artifacts("kept", include_deleted=True)]
    assert kinds == ["json_array", "text", "binary"]
    assert _sql(catalog, "SELECT count(*) FROM artifacts WHERE claimed_by IS NOT NULL") == [(0,)]
    # It works as a catalog: tombstones, pins, the log, new rows after the old ones.
    gone = catalog.find("kept", "c3")
    assert gone is not None and gone.state == "deleted" and gone.deleted_by == "manual"
    assert [r.artifact_id for r in catalog.artifacts("kept") if r.pinned] == ["c2"]
    assert [e.action for e in catalog.audit("kept")] == [
        "offload",
        "offload",
        "offload",
        "read",
        "pin",
        "delete",
    ]
    catalog.open_task("new", "{}")
    catalog.log("new", None, "read", "test")
    assert [e.id for e in catalog.audit("new")] == [11]
    catalog.close()
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        # A spillbox from before Alembic finds a schema version it does not know, and stops.
        marks = conn.execute("SELECT version, name FROM schema_migrations ORDER BY 1").fetchall()
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM artifacts WHERE task_id = 't1' AND sha256 = 'x'"
        ).fetchall()
    assert marks[-1] == (4, "moved_to_alembic") and len(marks) == 4
    assert "artifacts_by_digest" in str(plan)
    again = Catalog(home)
    assert not again.migrated and _old_rows(home)["artifacts"] == before["artifacts"]
    again.close()


def test_a_catalog_from_before_migrations_were_named_is_upgraded_too(home: Path) -> None:
    """Two migrations recorded by number alone: the third (the kind column) and the claims
    are applied, and the rows stay."""
    before = _old_catalog(home, "catalog_numbered_migrations.sql")
    catalog = Catalog(home)
    assert catalog.revision() == migrate.head()
    assert _old_rows(home) == before
    found, taken = catalog.identical("t1", "a" * 64, 10, "a2")
    assert found is not None and found.artifact_id == "a1" and found.kind is None
    assert not taken
    catalog.add_artifact(_row("t1", "a2", kind="ndjson"))
    assert [r.kind for r in catalog.artifacts("t1")] == [None, "ndjson"]
    catalog.close()


def test_a_newer_schema_is_refused_with_a_config_error(home: Path, catalog_url: str | None) -> None:
    Catalog(home, url=catalog_url).close()
    catalog = Catalog(home, url=catalog_url)
    with catalog.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'a_migration_from_the_future'"))
    catalog.close()
    with pytest.raises(ConfigError, match="newer than this spillbox knows.*upgrade spillbox"):
        Catalog(home, url=catalog_url)


def test_an_old_catalog_with_a_migration_this_spillbox_never_had_is_refused(home: Path) -> None:
    _old_catalog(home, "catalog_named_migrations.sql")
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        conn.execute("UPDATE schema_migrations SET name = 'from_a_fork' WHERE version = 3")
    with pytest.raises(ConfigError, match="'from_a_fork', newer than this spillbox knows"):
        Catalog(home)


_START = """
import sys
from pathlib import Path
from spillbox.catalog import Catalog
sys.stdin.readline()  # every process is up: open at once
catalog = Catalog(Path(sys.argv[1]), url=sys.argv[2] or None)
catalog.open_task(sys.argv[3], "{}")
print("migrated" if catalog.migrated else "found it current", flush=True)
"""


def test_processes_starting_at_once_migrate_once(home: Path, catalog_url: str | None) -> None:
    results = run_at_once(
        [[sys.executable, "-c", _START, str(home), catalog_url or "", f"t{k}"] for k in range(4)]
    )
    assert [(code, err) for code, _, err in results] == [(0, "")] * 4
    said = sorted(out.strip() for _, out, _ in results)
    assert said == ["found it current"] * 3 + ["migrated"]
    catalog = Catalog(home, url=catalog_url)
    assert {t.task_id for t in catalog.tasks()} == {"t0", "t1", "t2", "t3"}
    assert _sql(catalog, "SELECT version_num FROM alembic_version") == [(migrate.head(),)]
    catalog.close()


def test_processes_opening_a_catalog_from_before_alembic_at_once_upgrade_it_once(
    home: Path,
) -> None:
    before = _old_catalog(home, "catalog_named_migrations.sql")
    results = run_at_once(
        [[sys.executable, "-c", _START, str(home), "", f"t{k}"] for k in range(3)]
    )
    assert [(code, err) for code, _, err in results] == [(0, "")] * 3
    assert sorted(out.strip() for _, out, _ in results) == ["found it current"] * 2 + ["migrated"]
    after = _old_rows(home)
    assert after["artifacts"] == before["artifacts"] and after["access_log"] == before["access_log"]
    assert after["tasks"][:3] == before["tasks"] and len(after["tasks"]) == 6
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        marks = conn.execute("SELECT name FROM schema_migrations WHERE version > 3").fetchall()
    assert marks == [("moved_to_alembic",)]


def test_a_sqlite_url_keeps_its_catalog_and_compiled_sql_in_that_file(
    home: Path, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    catalog = Catalog(home, url=url)
    catalog.open_task("t1", "{}")
    assert catalog.path is None and catalog.where == url
    assert [task.task_id for task in catalog.tasks()] == ["t1"]
    catalog.close()
    assert (tmp_path / ("elsewhere.db" + SQL_CACHE_SUFFIX)).exists()
    assert not (home / CATALOG_FILE).exists()


def test_an_unwritable_home_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot create the spillbox home"):
        Catalog(blocker / "home")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("not a url", "is not a database URL"),
        ("mysql://u@h/db", "runs on SQLite or Postgres"),
        ("sqlite://", "names no file"),
        ("sqlite:///:memory:", "names no file"),
    ],
)
def test_a_catalog_url_it_cannot_use_is_a_config_error(home: Path, url: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        Catalog(home, url=url)


def test_a_postgres_server_that_does_not_answer_is_a_clear_error(
    home: Path, tmp_path: Path
) -> None:
    url = f"postgresql://spillbox:secret@/spillbox?host={tmp_path}"  # no server there
    with pytest.raises(StorageError, match="cannot reach the catalog database") as caught:
        Catalog(home, url=url)
    message = str(caught.value)
    assert "SPILLBOX_CATALOG_URL" in message and "\n" not in message
    assert "secret" not in message


def test_the_catalog_url_comes_from_the_settings(home: Path, postgres_url: str) -> None:
    assert Settings.from_env({"SPILLBOX_CATALOG_URL": postgres_url}).catalog_url == postgres_url
    assert Settings.from_env({}).catalog_url is None
    environ = {"SPILLBOX_CATALOG_URL": postgres_url}
    with Harness(sandbox="none", home=home, environ=environ, gc_interval=-1) as harness:
        assert harness.catalog.path is None and harness.catalog.engine.dialect.name == "postgresql"
        harness.task("t1").close()
    assert not (home / CATALOG_FILE).exists()
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        assert harness.catalog.path == home / CATALOG_FILE and harness.tasks() == []
    with Harness(sandbox="none", home=home, catalog_url=postgres_url, gc_interval=-1) as harness:
        assert harness.tasks() == ["t1"]


def test_a_tasks_usage_counts_its_live_artifacts_and_their_bytes(catalog: Catalog) -> None:
    for task_id in ("t1", "t2", "empty"):
        catalog.open_task(task_id, "{}")
    for artifact_id, size in (("a1", 10), ("a2", 20), ("a3", 40)):
        catalog.add_artifact(_row("t1", artifact_id, bytes=size))
    catalog.add_artifact(_row("t2", "b1", bytes=1_000))
    assert catalog.tombstone("t1", "a3", "manual")
    assert catalog.usage("t1") == (2, 30)
    assert catalog.usage("t1", other_than="a2") == (1, 10)
    assert catalog.usage("t1", other_than="a3") == (2, 30)
    assert catalog.usage("empty") == (0, 0)


def test_an_artifact_and_its_log_lines_are_written_at_once_and_once(catalog: Catalog) -> None:
    """add_artifact writes the row and the log lines of its offload and its redaction
    together (on Postgres in one statement). The very same row again is recorded already
    (a write sent again after its answer was lost): True, nothing written twice. Another
    artifact under a taken id, a tombstone's too, is refused with nothing written."""
    catalog.open_task("t1", "{}")
    row = _row("t1", "a1", call_id="call-7", tool="git_log", redactions=2, created_at=5.0)
    assert catalog.add_artifact(row, redacted='{"email": 2}')
    assert catalog.add_artifact(row, redacted='{"email": 2}')
    assert not catalog.add_artifact(dataclasses.replace(row, sha256="1" * 64))
    catalog.add_artifact(_row("t1", "a2", call_id="call-8"))
    assert catalog.tombstone("t1", "a2", "ttl")
    assert not catalog.add_artifact(_row("t1", "a2"))
    assert catalog.artifacts("t1") == [row]
    log = [(e.artifact_id, e.action, e.actor, e.detail) for e in catalog.audit("t1")]
    assert log == [
        ("a1", "offload", "git_log", "call-7"),
        ("a1", "redact", "retention", '{"email": 2}'),
        ("a2", "offload", "t", "call-8"),
        ("a2", "delete", "retention", "ttl"),
    ]


def test_the_accesses_of_one_query_are_one_write(catalog: Catalog) -> None:
    """A script that names several artifacts has each one's access and log line recorded
    by one batch (on Postgres one round trip); none named, nothing written."""
    catalog.open_task("t1", "{}")
    for artifact_id in ("a1", "a2", "a3"):
        catalog.add_artifact(_row("t1", artifact_id, created_at=1.0, last_access_at=1.0))
    batches: list[int] = []
    batch = catalog.db.batch

    def counted(doing: str, statements: Sequence[tuple[Statement, Any]]) -> None:
        batches.append(len(statements))
        batch(doing, statements)

    catalog.db.batch = counted  # type: ignore[method-assign]
    catalog.accessed("t1", ["a1", "a3"], 99.0, "query", "sandbox_exec.sql")
    catalog.accessed("t1", [], 99.0, "query", "sandbox_exec.sql")
    assert batches == [4]
    rows = {row.artifact_id: row for row in catalog.artifacts("t1")}
    assert [rows[a].expires_at for a in ("a1", "a2", "a3")] == [99.0, None, 99.0]
    assert rows["a1"].last_access_at > 1.0 and rows["a2"].last_access_at == 1.0
    log = [(e.artifact_id, e.action) for e in catalog.audit("t1") if e.action != "offload"]
    assert log == [("a1", "query"), ("a3", "query")]


def test_the_artifacts_of_one_call_are_listed_without_the_others(catalog: Catalog) -> None:
    """What the history looks up at every append: the rows of its call id alone (a task
    with many artifacts is not listed whole), live ones unless tombstones are asked for."""
    for task_id in ("t1", "t2"):
        catalog.open_task(task_id, "{}")
    catalog.add_artifact(_row("t1", "h1", call_id="spillbox:history", created_at=1.0))
    catalog.add_artifact(_row("t1", "h2", call_id="spillbox:history", created_at=2.0))
    catalog.add_artifact(_row("t1", "c1"))
    catalog.add_artifact(_row("t2", "h9", call_id="spillbox:history"))
    assert catalog.tombstone("t1", "h1", "manual")

    def ids(**options: Any) -> list[str]:
        return [r.artifact_id for r in catalog.artifacts("t1", **options)]

    assert ids(call_id="spillbox:history") == ["h2"]
    assert ids(call_id="spillbox:history", include_deleted=True) == ["h1", "h2"]
    assert ids(call_id="spillbox:history", named_in="h1 h2 c1", include_deleted=True) == [
        "h1",
        "h2",
    ]
    assert ids(call_id="nope") == []


def test_one_read_finds_the_oldest_identical_payload_and_whether_the_id_is_taken(
    catalog: Catalog,
) -> None:
    """What storing a payload asks first: the oldest live artifact with the same bytes
    (never a tombstone, never an appendable one, whose bytes change), and whether the id
    it would get is taken (a tombstone's too: an id is one artifact's forever)."""
    catalog.open_task("t1", "{}")
    catalog.open_task("t2", "{}")
    same = {"sha256": "a" * 64, "bytes": 10}
    catalog.add_artifact(_row("t1", "gone", **same))
    assert catalog.tombstone("t1", "gone", "manual")
    catalog.add_artifact(_row("t1", "grows", origin="append", **same))
    catalog.add_artifact(_row("t1", "first", created_at=100.0, **same))
    catalog.add_artifact(_row("t1", "second", created_at=200.0, **same))
    catalog.add_artifact(_row("t1", "other", sha256="b" * 64))
    catalog.add_artifact(_row("t2", "elsewhere", sha256="c" * 64))
    for ref, taken in [("gone", True), ("other", True), ("new", False), ("elsewhere", False)]:
        found, said = catalog.identical("t1", "a" * 64, 10, ref)
        assert found is not None and found.artifact_id == "first", ref
        assert said is taken, ref
    assert catalog.identical("t1", "a" * 64, 11, "first") == (None, True)
    assert catalog.identical("t1", "c" * 64, 10, "x") == (None, False)


def test_the_artifacts_a_script_names_are_found_by_the_database(catalog: Catalog) -> None:
    """An exec looks up the artifacts its script names (to log the query) without listing
    the task's others: the database finds an id or a file name anywhere in the script, as
    a substring, exactly as Python's `in` would (no LIKE wildcards), and a script holding
    what no catalog can take as text (a NUL, a lone surrogate) still finds them."""
    for task_id in ("t1", "t2"):
        catalog.open_task(task_id, "{}")
    for artifact_id in ("c1", "c10", "x--0123abcd", "a.b", "plain_1"):
        catalog.add_artifact(_row("t1", artifact_id))
    catalog.add_artifact(_row("t2", "other"))
    assert catalog.tombstone("t1", "a.b", "manual")
    scripts = [
        'SELECT * FROM "c10"',
        "cat /sandbox/offload/plain_1.json | jq .",
        "x--0123abcd\0\ud800 a.b.json",
        "a_b c%1 C1 other plainx1",
        "\u2028c1\u2028",
        "c" * 100_000,
        "",
    ]
    for script in scripts:
        for include_deleted in (False, True):
            every = catalog.artifacts("t1", include_deleted)
            want = [r.artifact_id for r in every if r.artifact_id in script or r.name in script]
            found = catalog.artifacts("t1", include_deleted, named_in=script)
            assert [r.artifact_id for r in found] == want, (script[:40], include_deleted)
    assert [r.artifact_id for r in catalog.artifacts("t1", named_in='FROM "c10"')] == ["c1", "c10"]
    [tombstone] = catalog.artifacts("t1", include_deleted=True, named_in="x\0\ud800 a.b.json")
    assert (tombstone.artifact_id, tombstone.state) == ("a.b", "deleted")


def test_two_catalogs_in_threads_lose_no_write(home: Path, catalog_url: str | None) -> None:
    Catalog(home, url=catalog_url).close()
    per_writer = 150
    errors: list[BaseException] = []

    def write(task_id: str) -> None:
        catalog = Catalog(home, url=catalog_url)
        try:
            catalog.open_task(task_id, "{}")
            for i in range(per_writer):
                if i % 3 == 0:
                    catalog.add_artifact(_row(task_id, f"a{i}"))
                else:
                    catalog.log(task_id, None, "read", "writer", str(i))
        except BaseException as e:
            errors.append(e)
        finally:
            catalog.close()

    threads = [threading.Thread(target=write, args=(f"t{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    catalog = Catalog(home, url=catalog_url)
    for n in range(2):
        # Every write is in the log: one per read, one per offload.
        assert len(catalog.audit(f"t{n}")) == per_writer
        assert len(catalog.artifacts(f"t{n}")) == per_writer // 3
    catalog.close()


_WRITER = """
import sys
from pathlib import Path
from spillbox.catalog import Catalog
home, url, task, n = Path(sys.argv[1]), sys.argv[2] or None, sys.argv[3], int(sys.argv[4])
catalog = Catalog(home, url=url)
catalog.open_task(task, "{}")
for i in range(n):
    catalog.log(task, None, "read", "proc", str(i))
    catalog.log("shared", None, "read", task, str(i))
"""


def test_two_processes_writing_at_once_lose_nothing(home: Path, catalog_url: str | None) -> None:
    Catalog(home, url=catalog_url).close()
    n = 200
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(home), catalog_url or "", f"p{k}", str(n)]
        )
        for k in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    catalog = Catalog(home, url=catalog_url)
    for k in range(2):
        assert [e.detail for e in catalog.audit(f"p{k}")] == [str(i) for i in range(n)]
    assert len(catalog.audit("shared")) == 2 * n
    assert {t.task_id for t in catalog.tasks()} == {"p0", "p1"}
    catalog.close()


_HARNESS = """
import dataclasses, json, sys
from spillbox import Harness, Policy, ToolResult
harness = Harness(sandbox="none", home=sys.argv[1], gc_interval=-1,
                  policy=Policy(per_call_tokens=50), catalog_url=sys.argv[3] or None)
task = harness.task("shared")
for i in range(15):
    rows = [{"writer": sys.argv[2], "i": i, "n": n} for n in range(40)]
    task.admit([ToolResult(call_id=f"c{i}", tool="t", content=json.dumps(rows))])
harness.close()
"""


def test_two_harness_processes_offloading_into_one_task_lose_nothing(
    home: Path, catalog_url: str | None
) -> None:
    Catalog(home, url=catalog_url).close()
    procs = [
        subprocess.Popen([sys.executable, "-c", _HARNESS, str(home), f"w{k}", catalog_url or ""])
        for k in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    catalog = Catalog(home, url=catalog_url)
    rows = catalog.artifacts("shared")
    assert len(rows) == len({r.artifact_id for r in rows}) == 30
    offload = home / "tasks" / "shared" / "offload"
    assert sorted(p.name for p in offload.iterdir()) == sorted(r.name for r in rows)
    for row in rows:
        data = (offload / row.name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == row.sha256
        assert len(data) == row.bytes
    assert len([e for e in catalog.audit("shared") if e.action == "offload"]) == 30
    catalog.close()


def test_a_lock_held_elsewhere_waits_then_raises_a_clear_error(home: Path) -> None:
    catalog = Catalog(home, busy_timeout=0.5)
    catalog.open_task("t1", "{}")
    other = sqlite3.connect(home / CATALOG_FILE, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        with pytest.raises(StorageError) as caught:
            catalog.log("t1", None, "read", "test")
        waited = time.monotonic() - started
        message = str(caught.value)
        assert "locked" in message
        assert "\n" not in message
        assert waited >= 0.4, "it must wait for the lock before giving up"
    finally:
        other.execute("ROLLBACK")
        other.close()
    catalog.log("t1", None, "read", "test")  # the lock is gone: writing works again
    assert [e.action for e in catalog.audit("t1")] == ["read"]
    catalog.close()


def test_a_postgres_lock_held_elsewhere_is_the_same_clear_error(
    home: Path, postgres_url: str
) -> None:
    import psycopg

    catalog = Catalog(home, busy_timeout=0.5, url=postgres_url)
    catalog.open_task("t1", "{}")
    with psycopg.connect(postgres_url) as other:
        other.execute("LOCK TABLE access_log IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StorageError, match="stayed locked by another process for 0.5 s"):
            catalog.log("t1", None, "read", "test")
        other.rollback()
    catalog.log("t1", None, "read", "test")
    assert [e.action for e in catalog.audit("t1")] == ["read"]
    catalog.close()


def test_a_batch_of_writes_that_fails_half_way_writes_nothing(catalog: Catalog) -> None:
    """A batch (on Postgres sent at once, BEGIN to COMMIT) is one transaction: a statement
    that fails takes back the ones before it, the error is the catalog's one line, and the
    next write finds the catalog as it was."""
    catalog.open_task("t1", "{}")
    catalog.add_artifact(_row("t1", "a1"))
    pin = (Statement("pin"), {"key_task": "t1", "key_artifact": "a1", "pinned": 1})
    bad_log = (Statement("insert_log", insert=True), {"task_id": "t1", "action": None})
    with pytest.raises(StorageError):
        catalog.db.batch("testing a batch", [pin, bad_log])
    assert catalog.artifacts("t1")[0].pinned is False
    assert [e.action for e in catalog.audit("t1")] == ["offload"]
    catalog.set_pinned("t1", "a1", True, "test")
    assert catalog.artifacts("t1")[0].pinned is True
    assert [e.action for e in catalog.audit("t1")] == ["offload", "pin"]


def test_postgres_connections_the_server_dropped_are_replaced(
    home: Path, postgres_url: str
) -> None:
    """No ping before each use: a pooled connection the server ended (a restart, an idle
    timeout) fails at the first statement of its use, which runs again on a new one."""
    import psycopg

    catalog = Catalog(home, url=postgres_url)
    catalog.open_task("t1", "{}")
    pooled = [catalog.engine.raw_connection() for _ in range(3)]  # three idle in the pool
    for connection in pooled:
        connection.close()
    with psycopg.connect(postgres_url, autocommit=True) as other:
        ended = other.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    assert len(ended) >= 3
    assert catalog.task("t1") is not None  # a read
    catalog.log("t1", None, "read", "test")  # a batch of writes (one round trip)
    writes = [
        lambda: catalog.log("t1", None, "read", "test"),
        lambda: catalog.add_artifact(_row("t1", "a1")),  # a write transaction
    ]
    for write in writes:  # each first after every pooled connection was ended
        with psycopg.connect(postgres_url, autocommit=True) as other:
            other.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        write()
    assert [e.action for e in catalog.audit("t1")] == ["read", "read", "offload"]
    catalog.close()


_LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


def test_a_lock_held_by_another_process_is_a_clear_error(home: Path) -> None:
    catalog = Catalog(home, busy_timeout=0.5)
    catalog.open_task("t1", "{}")
    locker = subprocess.Popen(
        [sys.executable, "-c", _LOCKER, str(home / CATALOG_FILE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert locker.stdout is not None and locker.stdout.readline() == "locked\n"
        with pytest.raises(StorageError, match="stayed locked by another process for 0.5 s"):
            catalog.add_artifact(_row("t1", "a1"))
    finally:
        locker.communicate("done\n", timeout=30)
    assert catalog.artifacts("t1") == []
    catalog.add_artifact(_row("t1", "a1"))
    assert [r.artifact_id for r in catalog.artifacts("t1")] == ["a1"]
    catalog.close()


def test_a_lock_released_in_time_is_waited_for(home: Path) -> None:
    catalog = Catalog(home, busy_timeout=5)
    catalog.open_task("t1", "{}")
    other = sqlite3.connect(home / CATALOG_FILE, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(0.3, lambda: other.execute("ROLLBACK"))
    release.start()
    try:
        catalog.log("t1", None, "read", "test")
    finally:
        release.join()
        other.close()
    assert len(catalog.audit("t1")) == 1
    catalog.close()


def test_a_damaged_catalog_is_a_storage_error(home: Path) -> None:
    home.mkdir(parents=True)
    (home / CATALOG_FILE).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StorageError, match="damaged"):
        Catalog(home)


def test_a_refused_record_is_not_called_damage_and_writes_nothing(
    home: Path, catalog_url: str | None
) -> None:
    catalog = Catalog(home, url=catalog_url)
    with pytest.raises(StorageError, match="(?i)refused a record .*foreign key") as caught:
        catalog.add_artifact(_row("no-such-task", "a1"))  # artifacts need their task's row
    assert "damaged" not in str(caught.value) and "\n" not in str(caught.value)
    assert catalog.artifacts("no-such-task") == [] and catalog.audit("no-such-task") == []
    catalog.close()


def test_tombstones_keep_when_and_why(home: Path, catalog_url: str | None) -> None:
    catalog = Catalog(home, url=catalog_url)
    catalog.open_task("t1", "{}")
    catalog.add_artifact(_row("t1", "a1"))
    catalog.add_artifact(_row("t1", "a2"))
    catalog.set_pinned("t1", "a2", True, "test")
    assert catalog.tombstone("t1", "a1", "ttl")
    assert not catalog.tombstone("t1", "a1", "ttl"), "deleting twice is a no-op"
    assert not catalog.tombstone("t1", "a2", "ttl"), "a pinned artifact is never tombstoned"
    assert [r.artifact_id for r in catalog.artifacts("t1")] == ["a2"]
    gone = catalog.find("t1", "a1")
    assert gone is not None and gone.state == "deleted" and gone.deleted_by == "ttl"
    assert "was deleted at " in gone.tombstone() and "by policy ttl" in gone.tombstone()
    actions = [(e.action, e.artifact_id) for e in catalog.audit("t1")]
    assert actions == [("offload", "a1"), ("offload", "a2"), ("pin", "a2"), ("delete", "a1")]
    catalog.close()


def test_a_task_reopened_after_deletion_starts_afresh(home: Path, catalog_url: str | None) -> None:
    catalog = Catalog(home, url=catalog_url)
    catalog.open_task("t1", '{"a": 1}')
    catalog.close_task("t1", delete_after=5.0)
    catalog.mark_task_deleted("t1", "ttl")
    row = catalog.open_task("t1", '{"a": 2}')
    assert (row.state, row.retention, row.closed_at, row.deleted_by) == (
        "open",
        '{"a": 2}',
        None,
        None,
    )
    catalog.close()


@pytest.fixture
def two_catalogs(home: Path, catalog_url: str | None) -> Iterator[tuple[Catalog, Catalog]]:
    """Two collectors' catalogs on one database, with a task t1."""
    first, second = Catalog(home, url=catalog_url), Catalog(home, url=catalog_url)
    first.open_task("t1", "{}")
    yield first, second
    first.close()
    second.close()


def test_collectors_claim_disjoint_batches_of_expired_artifacts(
    two_catalogs: tuple[Catalog, Catalog],
) -> None:
    first, second = two_catalogs
    now = time.time()
    for i in range(7):
        first.add_artifact(_row("t1", f"a{i}", expires_at=now - 100 + i))
    first.add_artifact(_row("t1", "pinned", expires_at=now - 100, pinned=True))
    first.add_artifact(_row("t1", "later", expires_at=now + 100))
    a = claims.claim_expired(first, now, limit=3)
    b = claims.claim_expired(second, now, limit=10)
    assert [r.artifact_id for r in a] == ["a0", "a1", "a2"], "oldest expiry first"
    assert [r.artifact_id for r in b] == ["a3", "a4", "a5", "a6"]
    assert claims.claim_expired(first, now) == [] and claims.claim_expired(second, now) == []
    # A claim runs out: a collector that died lets go after its lease.
    assert [r.artifact_id for r in claims.claim_expired(second, now + 601, limit=1)] == ["a0"]


def test_a_task_is_claimed_by_one_collector_until_released(
    two_catalogs: tuple[Catalog, Catalog],
) -> None:
    first, second = two_catalogs
    now = time.time()
    assert not claims.claim_task(first, "t1", now), "an open task is not collected"
    first.close_task("t1", delete_after=now - 1)
    assert claims.claim_task(first, "t1", now)
    assert not claims.claim_task(second, "t1", now)
    claims.release_task(second, "t1")  # not its claim: nothing changes
    assert not claims.claim_task(second, "t1", now)
    claims.release_task(first, "t1")
    assert claims.claim_task(second, "t1", now)


_NO_DRIVER = """
import sys
from pathlib import Path
sys.modules["psycopg"] = None  # as if the postgres extra were not installed
from spillbox.catalog import Catalog
from spillbox.errors import ConfigError
try:
    Catalog(Path(sys.argv[1]), url="postgresql://spillbox@/spillbox?host=/nowhere")
except ConfigError as e:
    print(e)
"""


def test_postgres_without_its_driver_says_which_extra_to_install(home: Path) -> None:
    said = subprocess.run(
        [sys.executable, "-c", _NO_DRIVER, str(home)], capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'spillbox[postgres]'" in said and "psycopg" in said
