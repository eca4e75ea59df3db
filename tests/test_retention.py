"""Retention policies: TTLs, quotas, pins, export permission, redaction, deletion that propagates.

Time is a fake clock (time.time shifted), so TTLs of minutes are tested without sleeping.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conftest import Clock
from spillbox import ConfigError, Harness, Policy, ToolResult
from spillbox.config import Settings
from spillbox.errors import RetentionError
from spillbox.harness import Task
from spillbox.notice import parse_notice
from spillbox.redaction import redact
from spillbox.retention import Retention, parse_duration, parse_size, quota_evictions
from spillbox.types import ArtifactRow


@pytest.fixture
def harness(home: Path) -> Iterator[Harness]:
    with Harness(
        sandbox="none", home=home, gc_interval=-1, policy=Policy(per_call_tokens=50)
    ) as harness:
        yield harness


def payload(tag: str, n: int = 40) -> str:
    """A JSON array well over the 50-token test limit; distinct tags give distinct bytes."""
    return json.dumps([{"id": i, "tag": tag, "body": f"{tag} row {i}"} for i in range(n)])


def offload(task: Task, call_id: str, content: str | bytes | None = None) -> ArtifactRow:
    [admitted] = task.admit(
        [
            ToolResult(
                call_id=call_id, tool="t", content=payload(call_id) if content is None else content
            )
        ]
    )
    assert admitted.offloaded and admitted.artifact is not None
    return task.artifact(admitted.artifact.id)


def offload_files(task: Task) -> list[str]:
    return sorted(p.name for p in task.storage.offload.iterdir())


def live_ids(task: Task) -> list[str]:
    return [row.artifact_id for row in task.artifacts()]


# Parsing


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("24h", 86400),
        ("7d", 604800),
        ("2w", 1209600),
        ("30", 30),
        ("1.5h", 5400),
        (" 10 m ", 600),
        ("0", 0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "-5s", "5x", "5 minutes", "1h30m", "h", "5mm"])
def test_bad_durations_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="bad duration.*90s, 15m, 24h or 7d"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("500K", 500 * 1024),
        ("20M", 20 * 1024**2),
        ("1G", 1024**3),
        ("1024", 1024),
        ("1.5K", 1536),
        ("10mb", 10 * 1024**2),
        ("2MiB", 2 * 1024**2),
        ("1T", 1024**4),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "big", "-1K", "5X", "1KBB", "M", "1 2K"])
def test_bad_sizes_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="bad size.*500K, 20M or 1G"):
        parse_size(text)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttl": -1},
        {"keep_after_close": -5},
        {"max_bytes": 0},
        {"max_artifacts": 0},
        {"ttl_from": "read"},
        {"on_quota": "drop"},
        {"export": "maybe"},
    ],
)
def test_bad_policies_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Retention(**kwargs)  # type: ignore[arg-type]


def test_a_policy_is_frozen_and_round_trips_through_json() -> None:
    policy = Retention(ttl=60, ttl_from="access", max_bytes=1000, on_quota="refuse", redact=True)
    assert Retention.from_json(policy.to_json()) == policy
    with pytest.raises(AttributeError):
        policy.ttl = 5  # type: ignore[misc]


def test_policy_from_textual_options_and_the_environment(home: Path) -> None:
    policy = Retention.from_options(
        {"ttl": "15m", "max_bytes": "20M", "max_artifacts": "3", "redact": "true", "export": None},
        Retention(export="allow"),
    )
    assert (policy.ttl, policy.max_bytes, policy.max_artifacts) == (900, 20 * 1024**2, 3)
    assert policy.redact and policy.export == "allow"
    assert Retention.from_options({"ttl": "forever"}, Retention()).ttl is None
    with pytest.raises(ConfigError, match="whole number"):
        Retention.from_options({"max_artifacts": "many"}, Retention())
    env = {
        "SPILLBOX_TTL": "24h",
        "SPILLBOX_TTL_FROM": "access",
        "SPILLBOX_KEEP_AFTER_CLOSE": "0",
        "SPILLBOX_MAX_BYTES": "500K",
        "SPILLBOX_MAX_ARTIFACTS": "7",
        "SPILLBOX_ON_QUOTA": "refuse",
        "SPILLBOX_EXPORT": "allow",
        "SPILLBOX_REDACT": "1",
    }
    assert Settings.from_env(env).retention == Retention(
        ttl=86400,
        ttl_from="access",
        keep_after_close=0,
        max_bytes=512000,
        max_artifacts=7,
        on_quota="refuse",
        export="allow",
        redact=True,
    )
    with pytest.raises(ConfigError):
        Settings.from_env({"SPILLBOX_TTL": "soon"})


def test_a_task_keeps_its_policy_and_a_new_one_is_logged(harness: Harness) -> None:
    harness.task("t1", retention=Retention(ttl=60, export="allow"))
    assert harness.task("t1").retention == Retention(ttl=60, export="allow")
    assert harness.existing("t1").retention.export == "allow"
    harness.task("t1", retention=Retention(ttl=120))
    assert harness.task("t1").retention.ttl == 120
    assert [e.action for e in harness.catalog.audit("t1")] == ["policy"]


# TTL


def test_ttl_from_creation_expires_and_gc_deletes(harness: Harness, clock: Clock) -> None:
    task = harness.task("t1", retention=Retention(ttl=60))
    row = offload(task, "c1")
    assert row.expires_at == pytest.approx(row.created_at + 60)
    task.read("c1")  # reading does not extend a TTL counted from creation
    clock.advance(59)
    assert harness.gc() == []
    clock.advance(2)
    [removal] = harness.gc()
    assert (removal.kind, removal.task_id, removal.what, removal.reason) == (
        "artifact",
        "t1",
        "c1",
        "ttl",
    )
    assert offload_files(task) == []
    with pytest.raises(RetentionError, match="by policy ttl"):
        task.read("c1")


def test_ttl_of_one_second_in_real_time(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(ttl=1))
    offload(task, "c1")
    assert harness.gc() == []
    time.sleep(1.2)
    assert [r.what for r in harness.gc()] == ["c1"]
    assert offload_files(task) == []


def test_ttl_from_access_is_pushed_back_by_each_read(harness: Harness, clock: Clock) -> None:
    task = harness.task("t1", retention=Retention(ttl=60, ttl_from="access"))
    created = offload(task, "c1")
    clock.advance(50)
    task.read("c1")
    row = task.artifact("c1")
    assert row.expires_at is not None and row.expires_at >= created.created_at + 50 + 60 - 1
    assert row.last_access_at >= created.created_at + 50
    clock.advance(50)  # 100 s after creation: past the first expiry, not the pushed one
    assert harness.gc() == []
    assert offload_files(task) == ["c1.json"]
    clock.advance(11)
    assert [r.what for r in harness.gc()] == ["c1"]
    assert offload_files(task) == []


def test_no_ttl_lives_until_the_task_is_deleted(harness: Harness, clock: Clock) -> None:
    task = harness.task("t1", retention=Retention(ttl=None))
    assert offload(task, "c1").expires_at is None
    clock.advance(10 * 365 * 86400)
    assert harness.gc() == []
    assert live_ids(task) == ["c1"]


# Quotas


def test_quota_by_count_evicts_the_oldest_unpinned(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(max_artifacts=2))
    for call in ("c1", "c2", "c3", "c4"):
        offload(task, call)
    assert live_ids(task) == ["c3", "c4"]
    assert offload_files(task) == ["c3.json", "c4.json"]
    for gone in ("c1", "c2"):
        row = harness.catalog.find("t1", gone)
        assert row is not None and row.state == "deleted" and row.deleted_by == "quota"


def test_a_quota_lists_the_task_only_when_the_payload_does_not_fit() -> None:
    """The database's count decides first: a payload that fits lists nothing; one that
    does not is decided on the listing (which may show room made meanwhile)."""

    def row(artifact_id: str, size: int, pinned: bool = False) -> ArtifactRow:
        return ArtifactRow(
            "t1", artifact_id, artifact_id, "t", f"{artifact_id}.json", "/p", size, None,
            None, "0" * 64, 0.0, 0.0, None, "live", pinned, 0, None, None,
        )  # fmt: skip

    def never() -> list[ArtifactRow]:
        raise AssertionError("listed although the payload fits")

    policy = Retention(max_bytes=100, max_artifacts=3)
    assert quota_evictions(policy, "t1", (2, 60), never, 40) == []
    rows = [row("a1", 30, pinned=True), row("a2", 30), row("a3", 30)]
    evicted = quota_evictions(policy, "t1", (3, 90), lambda: rows, 50)
    assert [r.artifact_id for r in evicted] == ["a2", "a3"]  # the pinned one stays
    assert quota_evictions(policy, "t1", (3, 90), lambda: rows[:1], 50) == []  # room made
    with pytest.raises(RetentionError, match="at its quota"):
        quota_evictions(Retention(max_artifacts=3, on_quota="refuse"), "t1", (3, 90),
                        lambda: rows, 40)  # fmt: skip


def test_quota_by_bytes_evicts_as_many_as_needed(harness: Harness) -> None:
    size = len(payload("c1").encode())
    task = harness.task("t1", retention=Retention(max_bytes=3 * size + 10))
    for call in ("c1", "c2", "c3"):
        offload(task, call)
    big = payload("bg", n=60)  # one and a half payloads: the two oldest must go
    assert size + 10 < len(big.encode()) <= 2 * size
    offload(task, "big", big)
    assert live_ids(task) == ["c3", "big"]
    assert sum(r.bytes for r in task.artifacts()) <= 3 * size + 10


_FILLER = """
import json, sys, time
from pathlib import Path
from spillbox import Harness, Policy, RetentionError, ToolResult
import spillbox.offload
from spillbox.retention import Retention

decide = spillbox.offload.quota_evictions
def decide_slowly(*args):
    evicted = decide(*args)
    time.sleep(0.003)  # widens the race between the quota decision and its record
    return evicted
spillbox.offload.quota_evictions = decide_slowly
name, mode = sys.argv[2], sys.argv[3]
retention = Retention(max_artifacts=5, on_quota=mode)
with Harness(sandbox="none", home=Path(sys.argv[1]), gc_interval=-1,
             policy=Policy(per_call_tokens=50)) as harness:
    task = harness.task("shared", retention=retention)
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    for i in range(40):
        rows = [{"id": j, "by": name, "n": i} for j in range(40)]
        try:
            task.admit([ToolResult(call_id=f"{name}-{i}", tool="t", content=json.dumps(rows))])
        except RetentionError:
            pass
"""


@pytest.mark.parametrize("mode", ["evict", "refuse"])
def test_two_processes_filling_one_task_stay_within_its_quota(home: Path, mode: str) -> None:
    fillers = [
        subprocess.Popen(
            [sys.executable, "-c", _FILLER, str(home), name, mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b", "c")
    ]
    for filler in fillers:  # each has opened the harness and the task
        assert filler.stdout is not None and filler.stdout.readline() == "ready\n"
    for filler in fillers:
        assert filler.stdin is not None
        filler.stdin.write("go\n")
        filler.stdin.flush()
    for filler in fillers:
        _, err = filler.communicate(timeout=120)
        assert filler.returncode == 0, err
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        task = harness.existing("shared")
        live = task.artifacts()
        assert len(live) == 5
        assert sorted(p.name for p in task.storage.offload.iterdir()) == sorted(
            row.name for row in live
        )


def test_quota_refuse_stores_nothing(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(max_artifacts=1, on_quota="refuse"))
    offload(task, "c1")
    with pytest.raises(RetentionError, match="quota"):
        task.admit([ToolResult(call_id="c2", tool="t", content=payload("c2"))])
    assert offload_files(task) == ["c1.json"]
    assert list(task.storage.incoming.iterdir()) == []
    assert live_ids(task) == ["c1"]
    assert harness.catalog.find("t1", "c2") is None
    assert [e.action for e in harness.catalog.audit("t1")] == ["offload"]


def test_a_payload_larger_than_the_whole_quota_is_refused_even_with_evict(
    harness: Harness,
) -> None:
    task = harness.task("t1", retention=Retention(max_bytes=100, on_quota="evict"))
    with pytest.raises(RetentionError, match="over task t1's quota of 100 bytes"):
        task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    assert offload_files(task) == []
    assert task.artifacts(include_deleted=True) == []


def test_the_same_bytes_again_take_no_quota(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(max_artifacts=1, on_quota="refuse"))
    offload(task, "c1", payload("same"))
    offload(task, "c2", payload("same"))  # identical: points at the stored copy
    assert live_ids(task) == ["c1"]


def test_a_repeated_result_names_the_artifact_that_holds_its_bytes(harness: Harness) -> None:
    # The repeat has no artifact of its own: its notice says which one to read and pin
    # (its call_id alone left `spillbox pin` with nothing to find).
    task = harness.task("t1")
    offload(task, "c1", payload("same"))
    [again] = task.admit([ToolResult(call_id="c2", tool="t", content=payload("same"))])
    fields = parse_notice(again.text)
    assert fields is not None and fields["call_id"] == "c2"
    held_by = fields["same_as"].split(" ", 1)[0]
    assert held_by == "c1" and fields["path"].endswith("/c1.json")
    assert task.pin(held_by).pinned
    assert task.read(held_by) == payload("same").encode()
    [first] = task.admit([ToolResult(call_id="c3", tool="t", content=payload("other"))])
    assert "same_as" not in (parse_notice(first.text) or {})


# Pins (legal hold)


def test_a_pin_survives_ttl_and_gc_and_unpinning_makes_it_collectable(
    harness: Harness, clock: Clock
) -> None:
    task = harness.task("t1", retention=Retention(ttl=60))
    offload(task, "c1")
    offload(task, "c2")
    assert task.pin("c1").pinned
    clock.advance(120)
    assert [r.what for r in harness.gc()] == ["c2"]
    assert live_ids(task) == ["c1"]
    assert task.read("c1") == payload("c1").encode()
    with pytest.raises(RetentionError, match="pinned"):
        task.delete("c1")
    assert harness.gc() == []
    assert not task.unpin("c1").pinned
    assert [r.what for r in harness.gc()] == ["c1"]
    assert offload_files(task) == []
    actions = [e.action for e in harness.catalog.audit("t1")]
    assert actions.count("pin") == 1 and actions.count("unpin") == 1


def test_quota_eviction_skips_pins_and_refuses_when_only_pins_remain(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(max_artifacts=2))
    offload(task, "c1")
    offload(task, "c2")
    task.pin("c1")
    offload(task, "c3")  # c2 is the oldest unpinned
    assert live_ids(task) == ["c1", "c3"]
    task.pin("c3")
    with pytest.raises(RetentionError, match="every remaining artifact is pinned"):
        task.admit([ToolResult(call_id="c4", tool="t", content=payload("c4"))])
    assert live_ids(task) == ["c1", "c3"]
    assert offload_files(task) == ["c1.json", "c3.json"]


def test_removing_a_task_keeps_pinned_artifacts_and_reports_them(harness: Harness) -> None:
    task = harness.task("t1")
    offload(task, "c1")
    offload(task, "c2")
    task.pin("c2")
    assert harness.remove("t1") == 1
    assert offload_files(task) == ["c2.json"]
    assert live_ids(task) == ["c2"]
    assert harness.catalog.find("t1", "c1").state == "deleted"  # type: ignore[union-attr]
    assert "t1" in harness.tasks()
    held = harness.existing("t1")
    assert held.read("c2") == payload("c2").encode()
    held.unpin("c2")
    assert harness.remove("t1") == 0
    assert not task.storage.root.exists()
    assert "t1" not in harness.tasks()


# Export


def test_export_is_denied_by_default_and_the_denial_is_logged(
    harness: Harness, tmp_path: Path
) -> None:
    task = harness.task("t1")
    offload(task, "c1")
    dest = tmp_path / "out.json"
    with pytest.raises(RetentionError, match="denied by the retention policy"):
        task.export("c1", dest)
    assert not dest.exists()
    [entry] = [e for e in harness.catalog.audit("t1") if e.action.startswith("export")]
    assert (entry.action, entry.artifact_id, entry.detail) == ("export_denied", "c1", str(dest))


def test_export_when_allowed_is_byte_exact_and_logged(harness: Harness, tmp_path: Path) -> None:
    task = harness.task("t1", retention=Retention(export="allow"))
    data = bytes(range(256)) * 64  # binary: stored and exported byte for byte
    offload(task, "c1", data)
    dest = tmp_path / "out.bin"
    assert task.export("c1", dest, actor="alice") == dest
    assert dest.read_bytes() == data
    [entry] = [e for e in harness.catalog.audit("t1") if e.action == "export"]
    assert (entry.artifact_id, entry.actor, entry.detail) == ("c1", "alice", str(dest))
    into_dir = task.export("c1", tmp_path)
    assert into_dir == tmp_path / task.artifact("c1").name
    assert hashlib.sha256(into_dir.read_bytes()).hexdigest() == task.artifact("c1").sha256


def test_export_refuses_to_overwrite(harness: Harness, tmp_path: Path) -> None:
    task = harness.task("t1", retention=Retention(export="allow"))
    offload(task, "c1")
    dest = tmp_path / "exists.json"
    dest.write_text("precious")
    with pytest.raises(ConfigError, match="already exists"):
        task.export("c1", dest)
    assert dest.read_text() == "precious"
    with pytest.raises(ConfigError, match="cannot export to"):
        task.export("c1", tmp_path / "missing" / "out.json")
    assert not (tmp_path / "missing").exists()
    assert not [e for e in harness.catalog.audit("t1") if e.action == "export"]


# Redaction

SECRETS = {
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_" + "A1b2C3d4E5" * 4,
    "private_key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq\nxyz\n"
    "-----END RSA PRIVATE KEY-----",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
    "password": "correct horse battery staple",
}


def test_redact_finds_each_kind_of_secret() -> None:
    text = json.dumps(SECRETS)
    clean, n = redact(text)
    assert n == 5
    for secret in SECRETS.values():
        assert secret not in clean
    for kind in ("aws_access_token", "github_pat", "private_key", "jwt", "password"):
        assert f"[REDACTED:{kind}]" in clean
    assert redact(clean) == (clean, 0), "redacting twice changes nothing"
    assert redact("nothing secret here") == ("nothing secret here", 0)


def test_redaction_happens_before_the_payload_is_written(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(redact=True))
    rows = [{"id": i, "note": "filler " * 5} for i in range(30)]
    rows[3].update(SECRETS)
    rows[20]["token"] = SECRETS["github"]  # the same secret twice counts twice
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=json.dumps(rows))])
    assert admitted.offloaded and admitted.artifact is not None
    stored = admitted.artifact.host_path.read_bytes()
    for secret in SECRETS.values():
        assert secret.encode() not in stored
        assert secret not in admitted.text, "nor does the notice's preview leak it"
    assert b"[REDACTED:aws_access_token]" in stored
    assert "redactions: 6" in admitted.text.splitlines()
    assert task.artifact("c1").redactions == 6
    assert admitted.artifact.sha256 == hashlib.sha256(stored).hexdigest()
    assert list(task.storage.incoming.iterdir()) == []


def test_without_redaction_bytes_are_kept_and_the_notice_says_nothing(harness: Harness) -> None:
    task = harness.task("t1")
    content = json.dumps([SECRETS] * 5)
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=content)])
    assert admitted.artifact is not None
    assert admitted.artifact.host_path.read_bytes() == content.encode()
    assert "redactions:" not in admitted.text


# Closing


def test_keep_after_close_zero_deletes_on_close(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(keep_after_close=0))
    offload(task, "c1")
    task.close()
    assert not task.storage.root.exists()
    assert harness.catalog.task("t1").state == "deleted"  # type: ignore[union-attr]
    assert harness.catalog.task("t1").deleted_by == "keep_after_close"  # type: ignore[union-attr]
    assert harness.tasks() == []


def test_keep_after_close_n_keeps_until_gc_after_n(harness: Harness, clock: Clock) -> None:
    task = harness.task("t1", retention=Retention(keep_after_close=3600))
    offload(task, "c1")
    task.close()
    assert harness.catalog.task("t1").state == "closed"  # type: ignore[union-attr]
    clock.advance(3500)
    assert harness.gc() == []
    assert offload_files(task) == ["c1.json"]
    clock.advance(200)
    removals = harness.gc()
    assert [(r.kind, r.what, r.reason) for r in removals] == [("task", "t1", "keep_after_close")]
    assert not task.storage.root.exists()
    assert harness.catalog.find("t1", "c1").deleted_by == "keep_after_close"  # type: ignore[union-attr]
    assert harness.gc() == []


def test_close_delete_true_removes_now(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(keep_after_close=None))
    offload(task, "c1")
    task.close(delete=True)
    assert not task.storage.root.exists()
    assert harness.catalog.task("t1").deleted_by == "manual"  # type: ignore[union-attr]


# Deletion propagates


def test_deleting_an_artifact_removes_payload_derived_copies_and_leaves_a_tombstone(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("spillbox.harness.CLOCK_SLACK_SECONDS", 0.05)
    task = harness.task("t1", retention=Retention(export="allow"))
    storage = task.storage
    (storage.work / "earlier.txt").write_text("a script's output from before c1 existed")
    time.sleep(0.2)  # beyond the clock slack: earlier.txt cannot hold c1
    row = offload(task, "c1")
    keep = offload(task, "c2")
    data = task.read("c1")
    (storage.cache / "c1.parquet").write_bytes(b"derived table")
    (storage.cache / "tables").mkdir()
    (storage.cache / "tables" / "c1.duckdb").write_bytes(b"derived")
    (storage.work / "nested").mkdir()
    (storage.work / "copy.json").write_bytes(data)
    (storage.work / "nested" / "again.json").write_bytes(data)
    (storage.work / "converted.csv").write_text("id,tag\n0,c1\n")  # not a copy: a conversion
    (storage.work / "old-copy.json").write_bytes(data)
    os.utime(storage.work / "old-copy.json", (0, 0))  # a script cannot set back its ctime
    task.delete("c1", by="operator")
    assert offload_files(task) == ["c2.json"]
    assert list(storage.cache.iterdir()) == []
    assert sorted(p.name for p in storage.work.rglob("*") if p.is_file()) == ["earlier.txt"]
    tomb = harness.catalog.find("t1", "c1")
    assert tomb is not None and tomb.state == "deleted" and tomb.deleted_by == "operator"
    assert tomb.sha256 == row.sha256 and tomb.bytes == row.bytes
    assert tomb.deleted_at is not None
    when = datetime.fromtimestamp(tomb.deleted_at, UTC).isoformat(timespec="seconds")
    expected = f"deleted at {when} by policy operator"
    for attempt in (
        lambda: task.read("c1"),
        lambda: task.read(row.path),
        lambda: task.export("c1", storage.root.parent / "x.json"),
        lambda: task.pin("c1"),
    ):
        with pytest.raises(RetentionError) as caught:
            attempt()
        assert expected in str(caught.value)
    assert task.read("c2") == payload("c2").encode()
    assert [r.artifact_id for r in task.artifacts(include_deleted=True)] == ["c1", "c2"]
    assert live_ids(task) == [keep.artifact_id]
    deletes = [e for e in harness.catalog.audit("t1") if e.action == "delete"]
    assert [(e.artifact_id, e.detail) for e in deletes] == [("c1", "operator")]


def test_a_new_artifact_with_a_deleted_call_id_is_found_live(harness: Harness) -> None:
    task = harness.task("t1")
    offload(task, "c1")
    task.delete("c1")
    offload(task, "c1", payload("second"))
    assert task.read("c1") == payload("second").encode()


def test_removing_a_task_leaves_nothing(harness: Harness) -> None:
    task = harness.task("t1")
    offload(task, "c1")
    offload(task, "c2")
    (task.storage.work / "scratch.txt").write_text("x")
    assert harness.remove("t1") == 0
    assert not task.storage.root.exists()
    row = harness.catalog.task("t1")
    assert row is not None and row.state == "deleted" and row.deleted_by == "manual"
    assert all(r.state == "deleted" for r in task.artifacts(include_deleted=True))
    assert harness.tasks() == []
    with pytest.raises(ConfigError, match="no task 't1'"):
        harness.existing("t1")
    assert harness.gc() == []
