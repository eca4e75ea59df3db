"""Which spillbox host keeps each task, in the catalog that every harness process shares.

A host (one per node of a Ray cluster) registers with a fresh epoch each time it starts. A
task is placed on one host's epoch and stays there: its payloads and sandbox exist on that
host only. When an epoch ends unplanned (its node died, or the host started again), the
tasks placed on it and their artifacts are marked lost: what was stored there is gone (a
host that comes back sweeps it), and no call is ever served from another host instead.

    placements = Placements(catalog)
    placements.register(HostRecord("node-a", epoch, node_id, cap=500))
    placements.claim("t1", "node-a", epoch)     # None if node-a is at its cap
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from spillbox.catalog import Catalog
from spillbox.catalog.database import Statement, Transaction

PLACED, LOST, SWEPT = "placed", "lost", "swept"
UNOPENED_GRACE_SECONDS = 60.0
"""How long a placement whose task never opened counts against its host's cap: its
harness claimed it and opens the task next, or died before it could."""
LOST_BY = "host lost"
"""deleted_by of the tasks and artifacts a lost host took with it ("host lost: <name>"):
tombstones, as any deletion leaves, whose reason says the payload went with its host."""


@dataclass(frozen=True)
class HostRecord:
    name: str
    epoch: str
    node_id: str
    cap: int
    """How many open tasks the host takes at most."""


@dataclass(frozen=True)
class HostLoad:
    name: str
    epoch: str
    cap: int
    open: int
    """Its open tasks, and those placed in the last UNOPENED_GRACE_SECONDS but not yet
    opened (a placement never opened stops counting then)."""


@dataclass(frozen=True)
class Placement:
    task_id: str
    host: str
    epoch: str
    state: str


# The statements (catalog/statements.py), by name
_LOADS = Statement("loads")
_LOAD_FOR_UPDATE = Statement("load_for_update")
_PLACEMENT = Statement("placement")
_ENDED_LOST = Statement("ended_lost")
_EPOCH_LOST = Statement("epoch_lost")
_HOST_LOST = Statement("host_lost")
_TASKS_LOST = Statement("tasks_lost")
_ARTIFACTS_LOST = Statement("artifacts_lost")
_TO_SWEEP = Statement("to_sweep")
_SWEPT = Statement("swept")
_UPSERT_HOST = Statement("upsert_host", insert=True)
_PLACE = Statement("place", insert=True)


class Placements:
    """The hosts table and the placements table of a catalog."""

    def __init__(self, catalog: Catalog) -> None:
        self._db = catalog.db

    def register(self, host: HostRecord) -> None:
        """Record a host's new epoch: what its earlier epochs kept is lost from now on."""
        args = _lost_args(host.name, host.epoch)
        with self._db.transaction("registering a spillbox host") as tx:
            tx.execute(_ENDED_LOST, args)
            self._mark_lost(tx, args)
            values = {
                "name": host.name,
                "node_id": host.node_id,
                "cap": host.cap,
                "state": "up",
                "started_at": args["at"],
                "lost_at": None,
                "epoch": host.epoch,
            }
            tx.execute(_UPSERT_HOST, values)

    def lose(self, host: str, epoch: str) -> None:
        """Mark a host's epoch lost (its node died): its tasks and artifacts with it."""
        args = _lost_args(host, epoch)
        with self._db.transaction("marking a spillbox host lost") as tx:
            tx.execute(_HOST_LOST, args)
            tx.execute(_EPOCH_LOST, args)
            self._mark_lost(tx, args)

    @staticmethod
    def _mark_lost(tx: Transaction, args: dict[str, Any]) -> None:
        for statement in (_TASKS_LOST, _ARTIFACTS_LOST):
            tx.execute(statement, args)

    def loads(self) -> list[HostLoad]:
        """The hosts that are up, least loaded first (then by name: a stated order)."""
        rows = self._db.rows("listing spillbox hosts", _LOADS, _since())
        return [HostLoad(**row) for row in rows]

    def claim(self, task_id: str, host: str, epoch: str) -> Placement | None:
        """Place the task on this host's epoch if it is under its cap; the task's existing
        placement if another process placed it first; None if the host is full (or gone).
        The host's row is locked meanwhile: two placements never both take its last slot."""
        args = {"host": host, "epoch": epoch, "task_id": task_id, **_since()}
        with self._db.transaction("placing a task") as tx:
            load = tx.rows(_LOAD_FOR_UPDATE, args)
            if load and load[0]["open"] < load[0]["cap"]:
                values = {
                    "task_id": task_id,
                    "host": host,
                    "epoch": epoch,
                    "state": PLACED,
                    "placed_at": time.time(),
                }
                tx.execute(_PLACE, values)
            found = tx.rows(_PLACEMENT, args)
        return _placement(found)

    def of(self, task_id: str) -> Placement | None:
        return _placement(self._db.rows("finding a task's host", _PLACEMENT, {"task_id": task_id}))

    def to_sweep(self, host: str) -> list[str]:
        """The tasks this host kept in an epoch now lost: what it removes when back."""
        rows = self._db.rows("listing lost tasks", _TO_SWEEP, {"host": host})
        return [row["task_id"] for row in rows]

    def swept(self, task_id: str) -> None:
        with self._db.transaction("recording a sweep") as tx:
            tx.execute(_SWEPT, {"task_id": task_id})


def _since() -> dict[str, float]:
    """The placements newer than this count against a cap while their task is unopened."""
    return {"since": time.time() - UNOPENED_GRACE_SECONDS}


def _lost_args(host: str, epoch: str) -> dict[str, Any]:
    return {"host": host, "epoch": epoch, "at": time.time(), "lost_by": f"{LOST_BY}: {host}"}


def _placement(found: list[dict[str, Any]]) -> Placement | None:
    if not found:
        return None
    return Placement(**{k: found[0][k] for k in ("task_id", "host", "epoch", "state")})
