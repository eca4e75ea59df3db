"""Garbage collection's claims on the catalog: what has expired, and who removes it.

On Postgres, SELECT ... FOR UPDATE SKIP LOCKED lets collectors on several hosts take
disjoint batches without waiting for each other; on SQLite (which has no FOR UPDATE) the
write lock serialises the claims, and a file lock in the home already serialises its
collectors. A claim lasts a lease: a collector that dies lets go of its work after it.

    for row in claim_expired(catalog, time.time()): ...        # then tombstone each
    if claim_task(catalog, "t1", time.time()): ...             # remove, then release_task
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import Select, Table, bindparam, or_, select, tuple_, update

from spillbox.catalog import _LIVE, Catalog, _artifact, _host, _on_host
from spillbox.catalog.schema import ARTIFACT_COLUMNS, artifacts, tasks
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

_EXPIRED = (
    _LIVE,
    artifacts.c.pinned == 0,
    artifacts.c.expires_at.is_not(None),
    artifacts.c.expires_at <= bindparam("now"),
)


def _unclaimed(table: Table) -> Any:
    """A row no collector holds: never claimed, or its claim's lease ran out by "now"."""
    return or_(table.c.claimed_until.is_(None), table.c.claimed_until <= bindparam("now"))


_CLAIM_TASK = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"), tasks.c.state == "closed", _unclaimed(tasks))
    .values(claimed_by=bindparam("holder"), claimed_until=bindparam("until"))
)
_RELEASE_TASK = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"), tasks.c.claimed_by == bindparam("holder"))
    .values(claimed_by=None, claimed_until=None)
)


def expired(catalog: Catalog, now: float, host: str | None = None) -> list[ArtifactRow]:
    """Every live, unpinned artifact past its expiry (claimed or not: a dry run's list);
    host: only those of tasks placed on that cluster host."""
    args = {"now": now, **_host(host)}
    rows = catalog.db.rows("finding expired artifacts", _expired_rows(host is not None), args)
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
    statement = _claim_expired(host is not None)
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


def _expired_where(on_host: bool) -> tuple[Any, ...]:
    """Live, unpinned and past expiry (on_host: of the tasks placed on one host only)."""
    return (*_EXPIRED, _on_host(artifacts.c.task_id)) if on_host else _EXPIRED


@cache
def _expired_rows(on_host: bool) -> Select[Any]:
    where = _expired_where(on_host)
    return select(*ARTIFACT_COLUMNS).where(*where).order_by(artifacts.c.expires_at)


@cache
def _claim_expired(on_host: bool) -> Any:
    """Claim a batch of expired artifacts no other collector holds (on_host: of the tasks
    placed on one host only)."""
    return (
        update(artifacts)
        .where(
            tuple_(artifacts.c.task_id, artifacts.c.artifact_id).in_(
                select(artifacts.c.task_id, artifacts.c.artifact_id)
                .where(*_expired_where(on_host), _unclaimed(artifacts))
                .order_by(artifacts.c.expires_at)
                .limit(bindparam("limit"))
                .with_for_update(skip_locked=True)
            )
        )
        .values(claimed_by=bindparam("holder"), claimed_until=bindparam("until"))
        .returning(*ARTIFACT_COLUMNS)
    )
