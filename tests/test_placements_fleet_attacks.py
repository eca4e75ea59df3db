"""What a cluster's hosts decide by the catalog, on Postgres and SQLite, without Ray: a
placement whose task never opened stops counting against its host's cap, and a host's
collection sees the tasks placed on it and no other host's."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

import spillbox.catalog.placements as placements_module
from spillbox.catalog import Catalog, claims
from spillbox.catalog.placements import HostRecord, Placements
from spillbox.types import ArtifactRow
from test_placements import _row


def _expired_row(task_id: str) -> ArtifactRow:
    return replace(_row(task_id), expires_at=1.0)


def test_a_placement_never_opened_stops_counting_against_its_hosts_cap(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A harness that placed a task and died before opening it held a slot for good: the
    # host counted it as open for as long as the placement row lived.
    placements = Placements(catalog)
    placements.register(HostRecord("a", "e1", "na", cap=1))
    assert placements.claim("never-opened", "a", "e1") is not None
    assert [(h.name, h.open) for h in placements.loads()] == [("a", 1)]  # its harness opens it
    assert placements.claim("next", "a", "e1") is None  # meanwhile a is full
    later = time.time() + placements_module.UNOPENED_GRACE_SECONDS + 1
    # The catalog's clock moves on past the grace (placements.py reads time.time()).
    monkeypatch.setattr(placements_module, "time", SimpleNamespace(time=lambda: later))
    assert [(h.name, h.open) for h in placements.loads()] == [("a", 0)]
    placed = placements.claim("next", "a", "e1")
    assert placed is not None and placed.host == "a"
    catalog.open_task("next", "{}")  # an opened task counts however old its placement
    assert [(h.name, h.open) for h in placements.loads()] == [("a", 1)]


def test_a_hosts_collection_sees_only_the_tasks_placed_on_it(catalog: Catalog) -> None:
    placements = Placements(catalog)
    for host in ("a", "b"):
        placements.register(HostRecord(host, "e1", f"n{host}", cap=5))
    for task_id, host in (("on-a", "a"), ("on-b", "b")):
        assert placements.claim(task_id, host, "e1") is not None
        catalog.open_task(task_id, "{}")
        assert catalog.add_artifact(_expired_row(task_id))
    catalog.open_task("alone", "{}")  # a task of one machine, placed nowhere
    now = time.time()
    assert [t.task_id for t in catalog.tasks(host="a")] == ["on-a"]
    assert [t.task_id for t in catalog.tasks(("open",), "b")] == ["on-b"]
    assert [t.task_id for t in catalog.tasks()] == ["alone", "on-a", "on-b"]
    assert [r.task_id for r in claims.expired(catalog, now, "b")] == ["on-b"]
    assert [r.task_id for r in claims.claim_expired(catalog, now, host="a")] == ["on-a"]
    assert claims.claim_expired(catalog, now, host="a") == []  # claimed, and b's is not a's
    assert [r.task_id for r in claims.claim_expired(catalog, now, host="b")] == ["on-b"]
    placements.lose("b", "e1")  # a lost host's tasks are no longer placed on it
    assert catalog.tasks(host="b") == []
