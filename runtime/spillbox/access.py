"""A task's artifacts as its callers reach them: found by reference, read, exported and
put under legal hold, each access logged and, where the policy counts time from access,
pushing the artifact's expiry back."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spillbox.catalog import Action, Catalog
from spillbox.catalog.placements import LOST_BY
from spillbox.errors import ConfigError, HostLostError, RetentionError
from spillbox.retention import Retention, expiry_after_access
from spillbox.sandbox import SandboxBackend
from spillbox.sandbox.storage import TaskStorage, write_new
from spillbox.types import ArtifactRow


@dataclass(frozen=True)
class TaskParts:
    """What the parts of one task (its admission, its access) share."""

    task_id: str
    catalog: Catalog
    backend: SandboxBackend
    storage: TaskStorage
    retention: Retention


class Access:
    """Lookups, reads, exports and pins of one task's artifacts, through the catalog."""

    def __init__(self, parts: TaskParts) -> None:
        self.task_id = parts.task_id
        self.catalog = parts.catalog
        self.backend = parts.backend
        self.storage = parts.storage
        self.retention = parts.retention

    def find(self, ref: str) -> ArtifactRow:
        """A live artifact by call id, path, id or file name (in the order Catalog.find
        tries them); a clear error if gone."""
        row = self.catalog.find(self.task_id, ref)
        if row is None:
            raise ConfigError(
                f"task {self.task_id!r} has no artifact {ref!r}: "
                f"list them with `spillbox artifacts {self.task_id}`"
            )
        if row.state == "deleted" and (row.deleted_by or "").startswith(LOST_BY):
            host = row.deleted_by.removeprefix(f"{LOST_BY}: ") if row.deleted_by else ""
            raise HostLostError(
                f"artifact {row.artifact_id} of task {self.task_id} is lost: spillbox host "
                f"{host!r}, which kept its payload (a node of the cluster), died or restarted; "
                "the payload is gone"
            )
        if row.state == "deleted":
            raise RetentionError(row.tombstone())
        return row

    def read(self, ref: str | ArtifactRow, actor: str) -> bytes:
        """The bytes of an artifact, by reference or as already looked up (logged as a read)."""
        row = self.find(ref) if isinstance(ref, str) else ref
        data = self._payload(row)
        self.accessed([row], "read", actor)
        return data

    def _payload(self, row: ArtifactRow) -> bytes:
        """The artifact's bytes as its row records them: an append in progress past them
        (Task.append) is not read until its row says it is there."""
        return self.backend.read(self.storage, row.name)[: row.bytes]

    def accessed(
        self, rows: Sequence[ArtifactRow], action: str, actor: str, detail: str = ""
    ) -> None:
        """Log a read or query of each; with TTL counted from access, push their expiry
        back (one write however many)."""
        expiry = expiry_after_access(self.retention, time.time())
        logged: Action = "query" if action == "query" else "read"
        ids = [row.artifact_id for row in rows]
        self.catalog.accessed(self.task_id, ids, expiry, logged, actor, detail)

    def export(self, ref: str, dest: str | Path, actor: str) -> Path:
        """Copy an artifact out of the sandbox, if the policy allows; always logged."""
        row = self.find(ref)
        target = Path(dest).expanduser()
        if self.retention.export != "allow":
            self.catalog.log(self.task_id, row.artifact_id, "export_denied", actor, str(target))
            raise RetentionError(
                f"export of {row.artifact_id} is denied by the retention policy of task "
                f"{self.task_id}: open the task with --export allow to permit it"
            )
        if target.is_dir():
            target = target / row.name
        if target.exists() or target.is_symlink():
            raise ConfigError(f"{target} already exists: choose another destination")
        data = self._payload(row)
        if hashlib.sha256(data).hexdigest() != row.sha256:
            raise RetentionError(
                f"artifact {row.artifact_id} no longer matches its recorded sha256: not exported"
            )
        write_new(target, data)
        self.catalog.log(self.task_id, row.artifact_id, "export", actor, str(target))
        return target

    def pin(self, ref: str, pinned: bool, actor: str) -> ArtifactRow:
        """Put an artifact under legal hold (nothing deletes it until unpinned), or lift it."""
        row = self.find(ref)
        self.catalog.set_pinned(self.task_id, row.artifact_id, pinned, actor)
        return self.find(row.artifact_id)
