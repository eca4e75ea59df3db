"""Garbage collection: what retention says must go, and whatever was orphaned.

Idempotent, and safe when several processes run it at once: a file lock in the home
serialises the collectors of one home, each expired artifact and each task past its keep
period is claimed in the catalog before it is deleted (so collectors on several hosts
sharing a Postgres catalog never delete the same thing), and each deletion tolerates one
that already happened. Runs when a harness starts, periodically while it runs, and as
`spillbox gc [--dry-run]`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from spillbox import metrics
from spillbox.catalog import Catalog, claims
from spillbox.config import Settings
from spillbox.retention import due_for_deletion
from spillbox.sandbox.base import SandboxBackend
from spillbox.sandbox.storage import (
    INCOMING_DIR,
    TASK_ID_FILE,
    TASKS_DIR,
    TaskStorage,
    exclusive,
)
from spillbox.types import ArtifactRow


class Collected(Protocol):
    """What collection works on: a harness (spillbox.harness.Harness satisfies this)."""

    settings: Settings
    catalog: Catalog
    backend: SandboxBackend

    def delete_artifact(self, row: ArtifactRow, by: str) -> None: ...

    def remove(self, task_id: str, by: str = "manual") -> int: ...


LOCK_FILE = "gc.lock"
GRACE_SECONDS = 300.0
"""Files younger than this are never orphans: their offload may still be under way."""


@dataclass(frozen=True)
class Removal:
    """One thing garbage collection removed (or, in a dry run, would remove)."""

    kind: str
    """"artifact", "task", "container", "storage", "payload" or "temp"."""
    task_id: str
    what: str
    reason: str


def collect(
    harness: Collected,
    dry_run: bool = False,
    grace: float = GRACE_SECONDS,
    host: str | None = None,
) -> list[Removal]:
    """Delete expired artifacts and tasks, then orphaned containers, folders and files.
    host: the cluster host collecting, which decides for the tasks placed on it alone (a
    task's open hold and its files are on its own host)."""
    home = harness.settings.home
    catalog = harness.catalog
    removed: list[Removal] = []
    now = time.time()
    # One collector at a time per home; a second one waits, then finds little to do.
    with exclusive(home / LOCK_FILE):
        for row in _expired(catalog, now, dry_run, host):
            removed.append(Removal("artifact", row.task_id, row.artifact_id, "ttl"))
            if not dry_run:
                harness.delete_artifact(row, by="ttl")
        for task in catalog.tasks(("closed",), host):
            if _past_keep(harness, task.task_id, now) is None:
                continue
            if not dry_run and not claims.claim_task(catalog, task.task_id, now):
                continue  # another collector (another host) is removing it
            try:
                removed.extend(_remove_task(harness, task.task_id, now, dry_run))
            finally:
                if not dry_run:
                    claims.release_task(catalog, task.task_id)
        known = {task.task_id for task in catalog.tasks(host=host)}
        # A closed task keeps its storage until retention says otherwise, but needs no
        # container: reopening it starts a new one over the same payloads. A container is
        # removed only under its task's open lock, with no process holding the task open.
        running = {task.task_id for task in catalog.tasks(("open",), host)}

        def unused(task_id: str) -> AbstractContextManager[bool]:
            if task_id in running:
                return nullcontext(False)
            return harness.backend.storage(task_id).unless_open()

        for what in harness.backend.sweep(unused, dry_run):
            removed.append(Removal("container", "", what, "task closed, unknown or deleted"))
        removed.extend(_sweep_storage(harness, known, dry_run, now - grace))
    if not dry_run:
        metrics.collected(removal.kind for removal in removed)
    return removed


def _expired(
    catalog: Catalog, now: float, dry_run: bool, host: str | None
) -> Iterator[ArtifactRow]:
    """The expired artifacts to delete: in a dry run all of them; otherwise those this
    collector claimed, batch after batch, until none is left unclaimed."""
    if dry_run:
        yield from claims.expired(catalog, now, host)
        return
    while batch := claims.claim_expired(catalog, now, host=host):
        yield from batch


def _remove_task(harness: Collected, task_id: str, now: float, dry_run: bool) -> list[Removal]:
    # Decided again under the task's open lock: a process may be re-opening it.
    with harness.backend.storage(task_id).unless_open() as nobody_has_it:
        reason = _past_keep(harness, task_id, now) if nobody_has_it else None
        if reason is None:
            return []
        if not dry_run:
            harness.remove(task_id, by=reason)
        return [Removal("task", task_id, task_id, reason)]


def _past_keep(harness: Collected, task_id: str, now: float) -> str | None:
    """Why a task is due for deletion now, or None if it is not (or not closed)."""
    task = harness.catalog.task(task_id)
    if task is None:
        return None
    return due_for_deletion(task, len(harness.catalog.artifacts(task_id)), now)


def _sweep_storage(
    harness: Collected, known: set[str], dry_run: bool, older_than: float
) -> Iterator[Removal]:
    home = harness.settings.home
    tasks_dir = home / TASKS_DIR
    if not tasks_dir.is_dir():
        return
    for root in sorted(tasks_dir.iterdir()):
        if not root.is_dir() or root.is_symlink():
            continue
        task_id = _task_id(root)
        if task_id is None or task_id not in known:
            if _mtime(root) < older_than and not _holds_pinned(harness, task_id):
                yield Removal("storage", task_id or "", str(root), "task unknown or deleted")
                if not dry_run:
                    shutil.rmtree(root, ignore_errors=True)  # rmtree never follows links
            continue
        storage = harness.backend.storage(task_id)
        yield from _sweep_task_files(harness, storage, dry_run, older_than)


def _sweep_task_files(
    harness: Collected, storage: TaskStorage, dry_run: bool, older_than: float
) -> Iterator[Removal]:
    """Temp files a crashed offload left, and payload files with no live catalog row."""
    incoming = storage.root / INCOMING_DIR
    if incoming.is_dir():
        with os.scandir(incoming) as entries:
            stale = [entry for entry in entries if _mtime(Path(entry.path)) < older_than]
        for entry in stale:
            yield Removal("temp", storage.task_id, entry.name, "interrupted offload")
            if not dry_run:
                _unlink(Path(entry.path))
    live = {row.name for row in harness.catalog.artifacts(storage.task_id)}
    for name in storage.names():
        path = storage.offload / name
        if name not in live and _mtime(path) < older_than:
            yield Removal("payload", storage.task_id, name, "no live catalog row")
            if not dry_run:
                storage.remove(name)


def _holds_pinned(harness: Collected, task_id: str | None) -> bool:
    return task_id is not None and any(row.pinned for row in harness.catalog.artifacts(task_id))


def _task_id(root: Path) -> str | None:
    id_file = root / TASK_ID_FILE
    if not id_file.is_file() or id_file.is_symlink():
        return None
    return id_file.read_text(encoding="utf-8")


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except FileNotFoundError:
        return time.time()


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass  # another collector got there first
