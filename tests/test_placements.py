"""The placement rule and lost hosts in the catalog, on Postgres (what a cluster shares)
and SQLite, without Ray: spillbox.catalog.placements."""

from __future__ import annotations

from spillbox.catalog import Catalog
from spillbox.catalog.placements import HostRecord, Placements
from spillbox.types import ArtifactRow


def _row(task_id: str) -> ArtifactRow:
    return ArtifactRow(
        task_id=task_id,
        artifact_id="c1",
        call_id="c1",
        tool="t",
        name="c1.txt",
        path="/sandbox/offload/c1.txt",
        bytes=1,
        tokens=None,
        tokens_exact=None,
        sha256="0",
        created_at=0.0,
        last_access_at=0.0,
        expires_at=None,
        state="live",
        pinned=False,
        redactions=0,
        deleted_at=None,
        deleted_by=None,
        kind="text",
        origin="call",
    )


def test_fewest_open_first_then_by_name_within_the_cap(catalog: Catalog) -> None:
    placements = Placements(catalog)
    placements.register(HostRecord("b", "e1", "nb", cap=2))
    placements.register(HostRecord("a", "e1", "na", cap=1))
    assert [h.name for h in placements.loads()] == ["a", "b"]  # both empty: by name
    assert placements.claim("t1", "a", "e1") is not None
    catalog.open_task("t1", "{}")
    assert placements.claim("t2", "a", "e1") is None  # a is at its cap of 1
    assert [(h.name, h.open) for h in placements.loads()] == [("b", 0), ("a", 1)]
    first = placements.claim("t2", "b", "e1")
    assert first is not None and first.host == "b"
    again = placements.claim("t2", "a", "e1")  # placed already: stays where it is
    assert again is not None and again.host == "b"
    catalog.close_task("t1", None)
    assert [(h.name, h.open) for h in placements.loads()] == [("a", 0), ("b", 1)]


def test_a_lost_epoch_takes_its_tasks_and_artifacts_and_only_theirs(catalog: Catalog) -> None:
    placements = Placements(catalog)
    placements.register(HostRecord("a", "e1", "na", cap=5))
    placements.register(HostRecord("b", "e1", "nb", cap=5))
    for task_id, host in (("on-a", "a"), ("on-b", "b")):
        assert placements.claim(task_id, host, "e1") is not None
        catalog.open_task(task_id, "{}")
        assert catalog.add_artifact(_row(task_id))
    placements.lose("b", "e1")
    assert [h.name for h in placements.loads()] == ["a"]
    lost = catalog.task("on-b")
    assert lost is not None and (lost.state, lost.deleted_by) == ("deleted", "host lost: b")
    [gone] = catalog.artifacts("on-b", include_deleted=True)
    assert (gone.state, gone.deleted_by) == ("deleted", "host lost: b")
    kept = catalog.task("on-a")
    assert kept is not None and kept.state == "open"
    assert [r.state for r in catalog.artifacts("on-a")] == ["live"]
    # b comes back with a new epoch: it sweeps on-b once, and a restart of a loses on-a.
    placements.register(HostRecord("b", "e2", "nb", cap=5))
    assert placements.to_sweep("b") == ["on-b"]
    placements.swept("on-b")
    assert placements.to_sweep("b") == []
    placements.register(HostRecord("a", "e2", "na", cap=5))
    assert placements.to_sweep("a") == ["on-a"]
    assert [r.deleted_by for r in catalog.artifacts("on-a", include_deleted=True)] == [
        "host lost: a"
    ]
