"""The catalog: numbered migrations, several writers on one home, a clear error when locked."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spillbox.catalog import CATALOG_FILE, MIGRATIONS, Catalog
from spillbox.errors import ConfigError, StorageError
from spillbox.types import ArtifactRow


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


def _versions(home: Path) -> list[int]:
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        return [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]


def test_migrations_are_recorded_in_the_database(home: Path) -> None:
    catalog = Catalog(home)
    assert catalog.schema_version() == len(MIGRATIONS)
    catalog.close()
    assert _versions(home) == list(range(1, len(MIGRATIONS) + 1))
    assert 1 in _versions(home)
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"tasks", "artifacts", "access_log", "schema_migrations"} <= tables


def test_reopening_is_idempotent_and_keeps_the_data(home: Path) -> None:
    catalog = Catalog(home)
    catalog.open_task("t1", "{}")
    catalog.add_artifact(_row("t1", "a1"))
    catalog.close()
    for _ in range(3):
        again = Catalog(home)
        assert again.schema_version() == len(MIGRATIONS)
        assert [r.artifact_id for r in again.artifacts("t1")] == ["a1"]
        again.close()
    assert _versions(home) == list(range(1, len(MIGRATIONS) + 1))


def test_an_older_catalog_is_migrated_in_place_and_keeps_its_data(home: Path) -> None:
    """A catalog written by a spillbox that knew only the first two migrations, and recorded
    them by number alone (as spillbox did before migrations were named)."""
    home.mkdir(parents=True)
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        for migration in MIGRATIONS[:2]:
            migration(conn)
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at)")
        conn.executemany("INSERT INTO schema_migrations VALUES (?, 0)", [(1,), (2,)])
        conn.execute("INSERT INTO tasks (task_id, created_at, retention) VALUES ('t1', 0, '{}')")
        old = _row("t1", "a1", sha256="a" * 64)
        conn.execute(
            f"INSERT INTO artifacts VALUES ({', '.join('?' * 18)})",
            [getattr(old, f) for f in old.__dataclass_fields__ if f != "kind"],
        )
    catalog = Catalog(home)
    assert _versions(home) == list(range(1, len(MIGRATIONS) + 1))
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM schema_migrations ORDER BY version")]
    assert names == [migration.__name__ for migration in MIGRATIONS]
    found = catalog.identical("t1", "a" * 64, 10)
    assert found is not None and found.artifact_id == "a1" and found.kind is None
    catalog.add_artifact(_row("t1", "a2", kind="ndjson"))
    assert [r.kind for r in catalog.artifacts("t1")] == [None, "ndjson"]
    catalog.close()
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM artifacts WHERE task_id = 't1' AND sha256 = 'x'"
        ).fetchall()
    assert "artifacts_by_digest" in str(plan)


@pytest.mark.parametrize("version", [len(MIGRATIONS) + 1, 2])
def test_a_newer_schema_is_refused_with_a_config_error(home: Path, version: int) -> None:
    """Newer: a migration this spillbox does not know, by number or by name."""
    Catalog(home).close()
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        conn.execute("DELETE FROM schema_migrations WHERE version = ?", (version,))
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?, 0.0, 'a_migration_from_the_future')",
            (version,),
        )
    with pytest.raises(ConfigError, match="newer than this spillbox knows.*upgrade spillbox"):
        Catalog(home)


def test_an_unwritable_home_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot create the spillbox home"):
        Catalog(blocker / "home")


def test_two_catalogs_in_threads_lose_no_write(home: Path) -> None:
    Catalog(home).close()
    per_writer = 150
    errors: list[BaseException] = []

    def write(task_id: str) -> None:
        catalog = Catalog(home)
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
    catalog = Catalog(home)
    for n in range(2):
        # Every write is in the log: one per read, one per offload.
        assert len(catalog.audit(f"t{n}")) == per_writer
        assert len(catalog.artifacts(f"t{n}")) == per_writer // 3
    catalog.close()


_WRITER = """
import sys
from pathlib import Path
from spillbox.catalog import Catalog
home, task, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
catalog = Catalog(home)
catalog.open_task(task, "{}")
for i in range(n):
    catalog.log(task, None, "read", "proc", str(i))
    catalog.log("shared", None, "read", task, str(i))
"""


def test_two_processes_writing_at_once_lose_nothing(home: Path) -> None:
    Catalog(home).close()
    n = 200
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(home), f"p{k}", str(n)])
        for k in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    catalog = Catalog(home)
    for k in range(2):
        assert [e.detail for e in catalog.audit(f"p{k}")] == [str(i) for i in range(n)]
    assert len(catalog.audit("shared")) == 2 * n
    assert {t.task_id for t in catalog.tasks()} == {"p0", "p1"}
    catalog.close()


_HARNESS = """
import json, sys
from spillbox import Harness, Policy, ToolResult
harness = Harness(sandbox="none", home=sys.argv[1], gc_interval=-1,
                  policy=Policy(per_call_tokens=50))
task = harness.task("shared")
for i in range(15):
    rows = [{"writer": sys.argv[2], "i": i, "n": n} for n in range(40)]
    task.admit([ToolResult(call_id=f"c{i}", tool="t", content=json.dumps(rows))])
harness.close()
"""


def test_two_harness_processes_offloading_into_one_task_lose_nothing(home: Path) -> None:
    Catalog(home).close()
    procs = [
        subprocess.Popen([sys.executable, "-c", _HARNESS, str(home), f"w{k}"]) for k in range(2)
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    catalog = Catalog(home)
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


def test_a_refused_record_is_not_called_damage_and_writes_nothing(home: Path) -> None:
    catalog = Catalog(home)
    with pytest.raises(StorageError, match="refused a record .*FOREIGN KEY") as caught:
        catalog.add_artifact(_row("no-such-task", "a1"))  # artifacts need their task's row
    assert "damaged" not in str(caught.value)
    assert catalog.artifacts("no-such-task") == [] and catalog.audit("no-such-task") == []
    catalog.close()


def test_tombstones_keep_when_and_why(home: Path) -> None:
    catalog = Catalog(home)
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
