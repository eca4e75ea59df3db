"""Garbage collection: dry runs, idempotence, two collectors at once, and orphans."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalog_backends import run_at_once
from conftest import Clock
from spillbox import Harness, Policy, ToolResult
from spillbox import gc as spillbox_gc
from spillbox.gc import Removal
from spillbox.harness import Task
from spillbox.retention import Retention
from spillbox.sandbox.storage import TaskStorage


def make_harness(home: Path, url: str | None, gc_interval: float = -1) -> Harness:
    return Harness(
        sandbox="none",
        home=home,
        gc_interval=gc_interval,
        policy=Policy(per_call_tokens=50),
        catalog_url=url,
    )


@pytest.fixture
def harness(home: Path, catalog_url: str | None) -> Iterator[Harness]:
    with make_harness(home, catalog_url) as harness:
        yield harness


def payload(tag: str) -> str:
    return json.dumps([{"id": i, "tag": tag, "body": f"{tag} row {i}"} for i in range(40)])


def offload(task: Task, call_id: str) -> None:
    [admitted] = task.admit([ToolResult(call_id=call_id, tool="t", content=payload(call_id))])
    assert admitted.offloaded


def files_under(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in (home / "tasks").rglob("*") if p.is_file())


def make_orphans(home: Path, task: Task, age: float = 0) -> None:
    """What crashes leave behind: a folder of an unknown task, a temp file, a stray payload."""
    ghost = TaskStorage(home, "ghost")
    ghost.ensure()
    ghost.write("g1", "json", b"[1]")
    (task.storage.incoming / "payload-crashed").write_bytes(b"half a paylo")
    (task.storage.offload / "stray.json").write_bytes(b"[2]")
    if age:
        then = time.time() - age
        for path in (
            ghost.root,
            task.storage.incoming / "payload-crashed",
            task.storage.offload / "stray.json",
        ):
            os.utime(path, (then, then))


def kinds(removals: list[Removal]) -> list[tuple[str, str, str]]:
    return sorted((r.kind, r.task_id, r.what.rsplit("/", 1)[-1]) for r in removals)


def test_dry_run_lists_everything_and_removes_nothing(harness: Harness, clock: Clock) -> None:
    home = harness.settings.home
    task = harness.task("t1", retention=Retention(ttl=60))
    offload(task, "c1")
    closing = harness.task("t2", retention=Retention(keep_after_close=10))
    offload(closing, "c2")
    closing.close()
    make_orphans(home, task)
    clock.advance(61)
    before = files_under(home)
    would = spillbox_gc.collect(harness, dry_run=True, grace=0)
    assert kinds(would) == [
        ("artifact", "t1", "c1"),
        ("payload", "t1", "stray.json"),
        ("storage", "ghost", "ghost"),
        ("task", "t2", "t2"),
        ("temp", "t1", "payload-crashed"),
    ]
    assert files_under(home) == before
    assert [r.artifact_id for r in task.artifacts()] == ["c1"]
    assert spillbox_gc.collect(harness, dry_run=True, grace=0) == would
    assert kinds(spillbox_gc.collect(harness, grace=0)) == kinds(would)
    assert files_under(home) == ["tasks/t1/task-id"]
    assert spillbox_gc.collect(harness, grace=0) == [], "a second run finds nothing"
    assert spillbox_gc.collect(harness, dry_run=True, grace=0) == []


def test_orphans_younger_than_the_grace_are_left_alone(harness: Harness) -> None:
    task = harness.task("t1")
    make_orphans(harness.settings.home, task)
    assert harness.gc() == []  # default grace: an offload may still be under way
    assert (task.storage.incoming / "payload-crashed").exists()
    old = time.time() - 2 * spillbox_gc.GRACE_SECONDS
    os.utime(task.storage.incoming / "payload-crashed", (old, old))
    assert kinds(harness.gc()) == [("temp", "t1", "payload-crashed")]


def test_each_kind_of_orphan_is_removed(harness: Harness) -> None:
    home = harness.settings.home
    task = harness.task("t1")
    offload(task, "c1")
    make_orphans(home, task)
    spillbox_gc.collect(harness, grace=0)
    assert not (home / "tasks" / "ghost").exists()
    assert list(task.storage.incoming.iterdir()) == []
    assert sorted(p.name for p in task.storage.offload.iterdir()) == ["c1.json"]
    assert task.read("c1") == payload("c1").encode(), "live payloads are never orphans"


def test_a_payload_whose_row_is_a_tombstone_is_an_orphan(harness: Harness) -> None:
    task = harness.task("t1")
    offload(task, "c1")
    # As if the process died between tombstoning the row and unlinking the file.
    assert harness.catalog.tombstone("t1", "c1", "manual")
    assert (task.storage.offload / "c1.json").exists()
    assert kinds(spillbox_gc.collect(harness, grace=0)) == [("payload", "t1", "c1.json")]
    assert list(task.storage.offload.iterdir()) == []


def test_storage_of_an_unknown_task_with_a_pin_elsewhere_is_still_swept(harness: Harness) -> None:
    task = harness.task("t1")
    offload(task, "c1")
    task.pin("c1")
    harness.task("t1").close()
    make_orphans(harness.settings.home, task)
    removed = kinds(spillbox_gc.collect(harness, grace=0))
    assert ("storage", "ghost", "ghost") in removed
    assert task.read("c1") == payload("c1").encode()


def test_two_collectors_in_threads_remove_each_thing_once(
    home: Path, clock: Clock, catalog_url: str | None
) -> None:
    with make_harness(home, catalog_url) as setup:
        for t in range(3):
            task = setup.task(f"t{t}", retention=Retention(ttl=60))
            for c in range(5):
                offload(task, f"c{c}")
        make_orphans(home, setup.task("t0"))
    clock.advance(61)
    results: list[list[Removal]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with make_harness(home, catalog_url) as harness:
                results.append(spillbox_gc.collect(harness, grace=0))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    everything = [r for result in results for r in result]
    assert len(everything) == len(set(everything)) == 15 + 3, "each thing removed exactly once"
    with make_harness(home, catalog_url) as harness:
        assert spillbox_gc.collect(harness, grace=0) == []
        for t in range(3):
            assert harness.catalog.artifacts(f"t{t}") == []
            assert list(harness.task(f"t{t}").storage.offload.iterdir()) == []
    assert files_under(home) == [f"tasks/t{t}/task-id" for t in range(3)]


def test_two_gc_processes_at_once_leave_a_consistent_state(
    home: Path, catalog_url: str | None
) -> None:
    with make_harness(home, catalog_url) as setup:
        for t in range(4):
            task = setup.task(f"t{t}", retention=Retention(ttl=1))
            for c in range(4):
                offload(task, f"c{c}")
        make_orphans(home, setup.task("t0"), age=2 * spillbox_gc.GRACE_SECONDS)
    time.sleep(1.1)  # real time: the collectors are other processes
    env = {**os.environ, "SPILLBOX_GC_INTERVAL": "never"}
    if catalog_url is not None:
        env["SPILLBOX_CATALOG_URL"] = catalog_url
    command = [sys.executable, "-m", "spillbox.cli", "gc", "--json", "--sandbox", "none"]
    procs = [
        subprocess.Popen(
            [*command, "--home", str(home)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    removed = [r for out, _ in outputs for r in json.loads(out)]
    artifacts = [(r["task_id"], r["what"]) for r in removed if r["kind"] == "artifact"]
    assert len(artifacts) == len(set(artifacts)) == 16
    orphans = sorted((r["kind"], r["task_id"]) for r in removed if r["kind"] != "artifact")
    assert orphans == [("payload", "t0"), ("storage", "ghost"), ("temp", "t0")]
    with make_harness(home, catalog_url) as harness:
        assert all(harness.catalog.artifacts(f"t{t}") == [] for t in range(4))
        assert harness.gc() == []
    assert files_under(home) == [f"tasks/t{t}/task-id" for t in range(4)]


def test_gc_runs_when_a_harness_starts(home: Path, clock: Clock, catalog_url: str | None) -> None:
    with make_harness(home, catalog_url) as setup:
        offload(setup.task("t1", retention=Retention(ttl=60)), "c1")
    clock.advance(61)
    with make_harness(home, catalog_url, gc_interval=0):
        pass  # close() waits for the start-up collection
    with make_harness(home, catalog_url) as harness:
        row = harness.catalog.find("t1", "c1")
        assert row is not None and row.state == "deleted" and row.deleted_by == "ttl"


def test_gc_runs_periodically_while_a_harness_runs(home: Path, catalog_url: str | None) -> None:
    with make_harness(home, catalog_url, gc_interval=0.05) as harness:
        offload(harness.task("t1", retention=Retention(ttl=0.3)), "c1")
        deadline = time.monotonic() + 10
        while harness.catalog.artifacts("t1") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert harness.catalog.artifacts("t1") == []
        assert harness.catalog.find("t1", "c1").deleted_by == "ttl"  # type: ignore[union-attr]


def test_a_pinned_artifact_of_a_task_past_keep_after_close_is_kept_and_gc_stays_idempotent(
    harness: Harness, clock: Clock
) -> None:
    task = harness.task("t1", retention=Retention(keep_after_close=10))
    offload(task, "c1")
    offload(task, "c2")
    task.pin("c2")
    task.close()
    clock.advance(11)
    assert kinds(harness.gc()) == [("task", "t1", "t1")]
    assert [r.artifact_id for r in task.artifacts()] == ["c2"]
    assert task.read("c2") == payload("c2").encode()
    assert harness.gc() == [], "a task held by a pin is not removed again on every run"


def test_a_task_reopened_while_collection_deletes_it_gets_whole_storage(
    home: Path, monkeypatch: pytest.MonkeyPatch, catalog_url: str | None
) -> None:
    """Seen with the MCP proxy: one process closed a task with no artifacts (due for
    deletion), the next opened it while its collector deleted it, and got a folder without
    offload/. The opener now waits for the deletion, then makes the folders afresh."""
    with make_harness(home, catalog_url) as harness:
        harness.task("t1").close()  # no artifacts: due for deletion ("expired")
        real_rmtree = shutil.rmtree
        deleting = threading.Event()

        def slow_rmtree(path: object, *args: object, **kwargs: object) -> None:
            # rmtree's order, as it happened: the folder's lock (where the open lock lived
            # before) went first, the rest was listed then and deleted after a pause.
            root = Path(str(path))
            lock = root / "open.lock"
            if lock.exists():
                lock.unlink()
            listed = list(root.iterdir())
            deleting.set()
            time.sleep(0.5)  # the opener runs now
            for child in listed:
                real_rmtree(child) if child.is_dir() else child.unlink()
            root.rmdir()  # as rmtree does: fails if anything appeared meanwhile

        monkeypatch.setattr(shutil, "rmtree", slow_rmtree)
        collector = threading.Thread(target=harness.gc)
        collector.start()
        assert deleting.wait(10)
        task = harness.task("t1")
        collector.join()
        monkeypatch.undo()
        [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload("a"))])
        assert admitted.offloaded
        assert task.read("c1") == payload("a").encode()
        assert (task.storage.work).is_dir()
        task.close(delete=True)


_HOST = """
import json, sys
from spillbox import Harness
from spillbox import gc
harness = Harness(sandbox="none", home=sys.argv[1], gc_interval=-1, catalog_url=sys.argv[2])
sys.stdin.readline()  # both hosts are up: collect at once
removed = gc.collect(harness, grace=0)
print(json.dumps([[r.kind, r.task_id, r.what] for r in removed]))
harness.close()
"""


def test_two_hosts_collecting_one_postgres_catalog_at_once_delete_each_thing_once(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two harness processes with homes of their own (two hosts) share one Postgres catalog
    and collect at the same moment: every expired artifact and every task past its keep
    period is deleted by exactly one of them, and neither fails."""
    home_a, home_b = tmp_path / "host-a", tmp_path / "host-b"
    expiring = {f"t{t}": [f"c{c}" for c in range(30)] for t in range(8)}
    with make_harness(home_a, postgres_url) as setup:
        for task_id, calls in expiring.items():
            task = setup.task(task_id, retention=Retention(ttl=1))
            for call_id in calls:
                offload(task, call_id)
        for k in range(6):
            closing = setup.task(f"k{k}", retention=Retention(keep_after_close=1))
            offload(closing, "c0")
            closing.close()
    time.sleep(1.1)  # real time: the collectors are other processes
    outputs = run_at_once(
        [[sys.executable, "-c", _HOST, str(home), postgres_url] for home in (home_a, home_b)]
    )
    assert [(code, err) for code, _, err in outputs] == [(0, "")] * 2
    removed = [tuple(r) for _, out, _ in outputs for r in json.loads(out)]
    artifacts = [r for r in removed if r[0] == "artifact"]
    tasks = [r for r in removed if r[0] == "task"]
    expected = {("artifact", t, c) for t, calls in expiring.items() for c in calls}
    assert len(artifacts) == len(set(artifacts)) and set(artifacts) == expected
    assert sorted(tasks) == [("task", f"k{k}", f"k{k}") for k in range(6)]
    with make_harness(home_a, postgres_url) as harness:
        for task_id, calls in expiring.items():
            deletions = [e for e in harness.catalog.audit(task_id) if e.action == "delete"]
            assert sorted(e.artifact_id or "" for e in deletions) == sorted(calls)
        for k in range(6):
            row = harness.catalog.task(f"k{k}")
            assert row is not None and row.state == "deleted"
        # Host B deleted some of host A's rows: host A's own sweep removes their files.
        spillbox_gc.collect(harness, grace=0)
        assert harness.gc() == []
    assert files_under(home_a) == [f"tasks/{t}/task-id" for t in sorted(expiring)]
