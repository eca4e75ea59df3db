"""Garbage collection's claims on the catalog: what has expired, and who removes it.

On Postgres, SELECT ... FOR UPDATE SKIP LOCKED lets collectors on several hosts take
disjoint batches without waiting for each other; on SQLite (which has no FOR UPDATE) the
write lock serialises the claims, and a file lock in the home already serialises its
collectors. A claim lasts a lease: a collector that dies lets go of its work after it.

    for row in claim_expired(catalog, time.time()): ...        # then tombstone each
    if claim_task(catalog, "t1", time.time()): ...             # remove, then release_task
"""

from __future__ import annotations

from spillbox.catalog import Catalog, _artifact, _host
from spillbox.catalog.database import Statement
from spillbox.types import ArtifactRow

__all__ = [
    "CLAIM_BATCH",
    "DEFAULT_CLAIM_LEASE",
    "claim_expired",
    "claim_task",
    "expired",
    "release_task",
]

DEFAULT_CLAIM_LEASE = 600.0
"""How long a collector's claim holds: one that dies lets go of its work after this."""
CLAIM_BATCH = 100
"""How many expired artifacts a collector claims at a time."""

_CLAIM_TASK = Statement("claim_task")
_RELEASE_TASK = Statement("release_task")


def expired(catalog: Catalog, now: float, host: str | None = None) -> list[ArtifactRow]:
    """Every live, unpinned artifact past its expiry (claimed or not: a dry run's list);
    host: only those of tasks placed on that cluster host."""
    args = {"now": now, **_host(host)}
    statement = Statement("expired_rows", (host is not None,))
    rows = catalog.db.rows("finding expired artifacts", statement, args)
    return [_artifact(row) for row in rows]


def claim_expired(
    catalog: Catalog,
    now: float,
    lease: float = DEFAULT_CLAIM_LEASE,
    limit: int = CLAIM_BATCH,
    host: str | None = None,
) -> list[ArtifactRow]:
    """Claim up to `limit` expired artifacts that no other collector holds; oldest expiry
    first. A claim lasts `lease` seconds: the tombstone ends the artifact's.
    host: only those of tasks placed on that cluster host."""
    args = {"now": now, "limit": limit, "holder": catalog.holder, "until": now + lease}
    statement = Statement("claim_expired", (host is not None,))
    with catalog.db.transaction("claiming expired artifacts") as tx:
        rows = [_artifact(row) for row in tx.rows(statement, {**args, **_host(host)})]
    return sorted(rows, key=lambda row: (row.expires_at or 0, row.task_id, row.artifact_id))


def claim_task(
    catalog: Catalog, task_id: str, now: float, lease: float = DEFAULT_CLAIM_LEASE
) -> bool:
    """Claim a closed task for removal; False if another collector holds it."""
    args = {"key_task": task_id, "now": now, "holder": catalog.holder, "until": now + lease}
    with catalog.db.transaction("claiming a task") as tx:
        return bool(tx.execute(_CLAIM_TASK, args))


def release_task(catalog: Catalog, task_id: str) -> None:
    """Let go of this collector's claim on a task (kept or removed)."""
    with catalog.db.transaction("releasing a task") as tx:
        tx.execute(_RELEASE_TASK, {"key_task": task_id, "holder": catalog.holder})
