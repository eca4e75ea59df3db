"""Attacks on identity (issue 21 items 5, 7, 8 and its rough edges): which names, folders,
containers and catalog rows an id maps to, and what a hostile id or answer can do.

- Distinct task ids never share a folder, a lock or a container name, whatever their
  spelling; a home made by the old naming is still found.
- A deleted artifact's id stays a tombstone forever (SQLite and Postgres).
- A model's call id always means the result of its call, never an output file named
  like it.
- A malformed id from a model, a malformed answer from a sandbox, a result over the size
  cap: that call gets an error result; nothing raises out of admit, Toolset.call or the loop.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spillbox import ConfigError, Harness, Policy, RetentionError, ToolResult
from spillbox.catalog import CATALOG_FILE, Catalog
from spillbox.errors import ExecError
from spillbox.loop import ScriptedModel, ToolCall, Turn, run
from spillbox.sandbox.docker import DockerBackend
from spillbox.sandbox.docker.answers import engine_answer, runner_end
from spillbox.sandbox.storage import (
    ESCAPE_MARK,
    TASK_ID_FILE,
    TASKS_DIR,
    TaskStorage,
    safe_name,
)
from spillbox.tools import Toolset
from test_catalog import _row

BIG = json.dumps([{"id": i, "pad": "victim " * 30} for i in range(400)])
"""Over the default per-call limit: offloaded."""


def open_harness(home: Path, catalog_url: str | None = None, **kwargs: Any) -> Harness:
    return Harness(
        sandbox="none", home=home, environ={}, gc_interval=-1, catalog_url=catalog_url, **kwargs
    )


@pytest.fixture
def harness(home: Path) -> Iterator[Harness]:
    with open_harness(home) as h:
        yield h


def old_name(ident: str) -> str:
    """The folder name spillbox gave a task id before ESCAPE_MARK (as the old code had it)."""
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", ident):
        return ident
    digest = hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    prefix = re.sub(r"[^A-Za-z0-9_-]+", "_", ident).strip("_-")[:40] or "id"
    return f"{prefix}-{digest}"


# Item 7: task ids


def test_the_escaped_name_of_an_id_is_not_another_tasks_home(harness: Harness) -> None:
    victim = harness.task("../victim")
    [admitted] = victim.admit([ToolResult("c1", "secrets", BIG)])
    assert admitted.offloaded
    for spelling in (safe_name("../victim"), old_name("../victim")):
        assert spelling != "../victim"
        other = harness.task(spelling)
        assert other.storage.root != victim.storage.root
        assert other.storage.open_lock != victim.storage.open_lock
        assert other.storage.name != victim.storage.name
        assert list(other.storage.offload.iterdir()) == []
        with pytest.raises(ConfigError):
            other.read("c1")
        other.close(delete=True)
    # Removing the others took nothing of the victim's: its payload is there and live.
    assert victim.read("c1") == BIG.encode()
    assert [row.state for row in victim.artifacts(include_deleted=True)] == ["live"]
    victim.close()


@settings(max_examples=300, deadline=None)
@given(ident=st.text(min_size=1, max_size=80))
def test_no_plain_id_is_the_name_of_another_id(ident: str) -> None:
    name = safe_name(ident)
    if name != ident:
        # The escaped name, taken as an id of its own, is escaped again: never the same.
        assert safe_name(name) != name


def test_container_names_follow_the_tasks_own_folder(home: Path) -> None:
    backend = DockerBackend(home)
    names = {
        backend.container_name(TaskStorage(home, ident))
        for ident in ("../victim", safe_name("../victim"), old_name("../victim"))
    }
    assert len(names) == 3


def make_old_home(home: Path, task_id: str, payload: bytes) -> Path:
    """A task's folder as the old naming made it: tasks/<old name>, recording the id."""
    with open_harness(home) as harness:
        task = harness.task(task_id)
        task.admit([ToolResult("c1", "t", payload.decode())])
        task.close()
        new = task.storage.root
    old = home / TASKS_DIR / old_name(task_id)
    if old != new:
        shutil.move(new, old)
    return old


@pytest.mark.parametrize("task_id", ["../victim", "plain-0123456789ab", "a--b", "t1"])
def test_a_home_made_by_the_old_naming_is_found_again(home: Path, task_id: str) -> None:
    old = make_old_home(home, task_id, BIG.encode())
    with open_harness(home) as harness:
        task = harness.task(task_id)
        assert task.storage.root == old
        assert task.read("c1") == BIG.encode()
        task.close(delete=True)
        assert not old.exists()


def test_an_old_folder_two_ids_shared_stays_the_first_ids(home: Path) -> None:
    """Under the old naming, "../victim" and the plain id of its old name shared one folder;
    the folder records the first's id, and the second now gets a folder of its own."""
    shared = make_old_home(home, "../victim", BIG.encode())
    intruder_id = old_name("../victim")
    assert shared.name == intruder_id
    assert (shared / TASK_ID_FILE).read_bytes() == b"../victim"
    with open_harness(home) as harness:
        intruder = harness.task(intruder_id)
        assert intruder.storage.root != shared
        assert ESCAPE_MARK in intruder.storage.name
        intruder.admit([ToolResult("c1", "t", BIG.replace("victim", "intruder"))])
        intruder.close(delete=True)
        victim = harness.task("../victim")
        assert victim.storage.root == shared
        assert victim.read("c1") == BIG.encode()
        victim.close()


# Item 5: a tombstone is never overwritten


def test_the_catalog_never_turns_a_tombstone_back_to_live(
    home: Path, catalog_url: str | None
) -> None:
    catalog = Catalog(home, url=catalog_url)
    try:
        catalog.open_task("t1", "{}")
        assert catalog.add_artifact(_row("t1", "c1", sha256="ab" * 32, created_at=1.0))
        assert catalog.tombstone("t1", "c1", by="manual")
        assert catalog.id_taken("t1", "c1")
        # The same id again, live, with the same bytes: refused, nothing written.
        assert not catalog.add_artifact(_row("t1", "c1", created_at=2.0))
        assert not catalog.add_artifact(_row("t1", "c1", state="live", sha256="cd" * 32))
        [row] = catalog.artifacts("t1", include_deleted=True)
        assert (row.state, row.sha256, row.created_at) == ("deleted", "ab" * 32, 1.0)
        assert [e.action for e in catalog.audit("t1")] == ["offload", "delete"]
        # A live id is not replaced either.
        assert catalog.add_artifact(_row("t1", "c2"))
        assert not catalog.add_artifact(_row("t1", "c2", bytes=99))
        assert catalog.find("t1", "c2").bytes == 10  # type: ignore[union-attr]
    finally:
        catalog.close()


@pytest.mark.parametrize("again", ["the call id used again", "the bytes copied back"])
def test_a_deleted_artifacts_id_is_never_given_again(
    home: Path, catalog_url: str | None, again: str
) -> None:
    with open_harness(home, catalog_url) as harness:
        task = harness.task("t1")
        [first] = task.admit([ToolResult("c1", "t", BIG)])
        assert first.artifact is not None and first.artifact.name == "c1.json"
        task.delete("c1")
        if again == "the call id used again":
            [admitted] = task.admit([ToolResult("c1", "t", BIG.replace("victim", "second"))])
            assert admitted.artifact is not None
            later = admitted.artifact
            # The model's call id means its latest (live) result.
            assert task.read("c1") == BIG.replace("victim", "second").encode()
        else:
            # A script copies the kept bytes to /sandbox/outputs/c1.json.
            later = task.store_file("c1.json", BIG.encode(), "sandbox_exec.sh")
            assert later.sha256 == first.artifact.sha256
        assert later.id == "c1-2"
        rows = {row.artifact_id: row for row in task.artifacts(include_deleted=True)}
        assert (rows["c1"].state, rows["c1"].sha256) == ("deleted", first.artifact.sha256)
        assert rows["c1-2"].state == "live"
        with pytest.raises(RetentionError, match="was deleted"):
            task.read(first.artifact.path)
        task.close()


def test_a_stem_is_never_given_twice_under_two_extensions(harness: Harness) -> None:
    """The stem is the artifact id: a text result of call c1 after c1's JSON one is
    c1-2.txt (the catalog knows c1), and a file a crashed offload left with no row
    (c5.csv, there before this process published anything) keeps c5 from a new payload
    too, although the catalog does not know it."""
    storage = TaskStorage(harness.settings.home, "t2")
    storage.ensure()
    (storage.offload / "c5.csv").write_bytes(b"a\n1\n")
    task = harness.task("t2")
    [json_result] = task.admit([ToolResult("c1", "t", BIG)])
    [text_result] = task.admit([ToolResult("c1", "t", "plain words " * 3000)])
    [after_crash] = task.admit([ToolResult("c5", "t", BIG.replace("victim", "c5"))])
    names = [a.artifact.name for a in (json_result, text_result, after_crash) if a.artifact]
    assert names == ["c1.json", "c1-2.txt", "c5-2.json"]
    task.close()


# The rough edge: an output file named like a call id


def test_an_output_file_named_like_a_later_call_id_never_shadows_its_result(
    home: Path, catalog_url: str | None, tmp_path: Path
) -> None:
    with open_harness(home, catalog_url) as harness:
        task = harness.task("t1", retention=replace(harness.settings.retention, export="allow"))
        decoy = task.store_file("c5.json", b'[{"decoy": true}]', "sandbox_exec.sh")
        assert decoy.id == "c5"
        [real] = task.admit([ToolResult("c5", "list_prs", BIG)])
        assert real.artifact is not None and real.artifact.id != "c5"
        toolset = Toolset(task)
        for ref in ("c5", real.artifact.path, real.artifact.id):
            assert task.artifact(ref).artifact_id == real.artifact.id
            page = toolset.call(
                "read_artifact", {"artifact_id": ref, "path": None, "cursor": None, "records": None}
            )
            assert json.loads(page.text)["artifact_id"] == real.artifact.id
        assert task.export("c5", tmp_path / "out.json").read_bytes() == BIG.encode()
        assert task.pin("c5").artifact_id == real.artifact.id
        # The decoy is still found by what it was shown as: its path and its file name.
        assert task.artifact(decoy.path).artifact_id == "c5"
        assert task.artifact("c5.json").artifact_id == "c5"
        task.unpin("c5")
        task.close()


def test_an_output_file_named_like_an_earlier_call_id_never_shadows_its_result(
    harness: Harness,
) -> None:
    task = harness.task("t1")
    [real] = task.admit([ToolResult("c5", "list_prs", BIG)])
    decoy = task.store_file("c5", b"decoy", "sandbox_exec.sh")
    assert real.artifact is not None and decoy.id != real.artifact.id
    assert task.artifact("c5").artifact_id == real.artifact.id
    assert task.read("c5") == BIG.encode()
    task.close()


# Item 8: malformed ids from a model


def test_a_call_id_with_a_lone_surrogate_gets_an_error_result(harness: Harness) -> None:
    task = harness.task("t1")
    results = [
        ToolResult("c\udc80", "list_prs", BIG),
        ToolResult("c2", "list_prs", BIG),
        ToolResult("c3", "t\ud800", "small"),
    ]
    bad, good, bad_tool = task.admit(results)
    assert (bad.call_id, bad.is_error, bad.offloaded, bad.reason) == (
        "c\udc80",
        True,
        False,
        "refused",
    )
    assert "lone surrogate at position 1" in bad.text and "\n" not in bad.text
    assert bad_tool.reason == "refused" and "tool name" in bad_tool.text
    assert good.offloaded and good.call_id == "c2"
    assert [row.call_id for row in task.artifacts()] == ["c2"]
    task.close()


@pytest.mark.parametrize("call_id", ["c\x00", "\x00", "c\udc80\x00"])
def test_a_call_id_no_catalog_can_hold_is_refused_on_both_databases(
    home: Path, catalog_url: str | None, call_id: str
) -> None:
    with open_harness(home, catalog_url) as harness:
        task = harness.task("t1")
        bad, good = task.admit([ToolResult(call_id, "t", BIG), ToolResult("c2", "t", BIG)])
        assert bad.reason == "refused" and bad.is_error and bad.call_id == call_id
        assert "lone surrogate" in bad.text or "NUL character" in bad.text
        assert good.offloaded
        with pytest.raises(ConfigError, match="NUL character"):
            harness.task("t\x00")
        task.close()


def test_a_model_id_with_a_lone_surrogate_is_an_error_result_of_the_tool(
    harness: Harness,
) -> None:
    toolset = Toolset(harness.task("t1"))
    args = {"artifact_id": "c\udc80", "path": None, "cursor": None, "records": None}
    output = toolset.call("read_artifact", args)
    assert output.is_error
    assert "lone surrogate" in json.loads(output.text)["error"]


def test_the_loop_runs_on_past_a_call_id_with_a_lone_surrogate(harness: Harness) -> None:
    task = harness.task("t1")
    calls = (
        ToolCall("c\udc80", "list_artifacts", {}),
        ToolCall("ok", "list_artifacts", {}),
    )

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        if messages[-1]["role"] == "user":
            return Turn(tool_calls=calls)
        return Turn(text="done")

    result = run(task, ScriptedModel(script), "go")
    assert result.answer == "done"
    bad, ok = result.steps[0].admitted
    assert bad.is_error and "lone surrogate" in bad.text
    assert not ok.is_error and ok.text == "[]"
    task.close()


def test_a_task_id_with_a_lone_surrogate_is_a_clear_error(harness: Harness) -> None:
    with pytest.raises(ConfigError, match="lone surrogate at position 2"):
        harness.task("t1\udc80")


# Item 8: malformed answers from a sandbox (the parsers; tests/sandbox has the live attack)


@pytest.mark.parametrize(
    "answer",
    [
        b'{"exit_code": 1e999, "oom_killed": false}',
        b'{"exit_code": Infinity, "oom_killed": false}',
        b'{"exit_code": NaN, "oom_killed": false}',
        b'{"exit_code": 256, "oom_killed": false}',
        b'{"exit_code": -1, "oom_killed": false}',
        b'{"exit_code": true, "oom_killed": false}',
        b'{"exit_code": 1.0, "oom_killed": false}',
        b'{"exit_code": "0", "oom_killed": false}',
        b'{"oom_killed": false}',
        b'{"exit_code": 0, "oom_killed": 1}',
        b'{"exit_code": 0, "oom_killed": false, "outputs": "yes"}',
        b'{"exit_code": 0, "oom_killed": false, "outputs": null}',
        b"[0, false]",
        b"not json",
        b"[" * 100_000,
        b'{"exit_code": ' + b"9" * 5000 + b"}",
    ],
)
def test_a_malformed_runner_end_is_an_exec_error(answer: bytes) -> None:
    with pytest.raises(ExecError, match="the sandbox's answer was malformed") as e:
        runner_end(answer, "n1")
    assert "\n" not in str(e.value)


def test_a_well_formed_runner_end_is_read() -> None:
    end = runner_end(
        b'{"exit_code": 137, "oom_killed": true, "outputs": true, "nonce": "n1"}', "n1"
    )
    assert (end.exit_code, end.oom_killed, end.outputs) == (137, True, True)
    assert (
        runner_end(b'{"exit_code": 0, "oom_killed": false, "nonce": "n1"}', "n1").outputs is False
    )


def test_an_end_with_another_calls_nonce_is_an_exec_error() -> None:
    for nonce in (b'"n2"', b"null", b"1"):
        answer = b'{"exit_code": 0, "oom_killed": false, "nonce": ' + nonce + b"}"
        with pytest.raises(ExecError, match="not this call's end"):
            runner_end(answer, "n1")


@pytest.mark.parametrize(
    "answer",
    [
        {"exit_code": float("inf"), "stdout": "", "stderr": ""},
        {"exit_code": 0, "stdout": 1, "stderr": ""},
        {"exit_code": 0, "stdout": "\udc80", "stderr": ""},
        {"exit_code": 0, "stdout": "", "stderr": "", "timed_out": "no"},
        {"exit_code": 0, "stdout": "", "stderr": "", "truncated": 0},
        [],
    ],
)
def test_a_malformed_engine_answer_is_an_exec_error(answer: Any) -> None:
    with pytest.raises(ExecError, match="the sandbox's answer was malformed"):
        engine_answer(answer)


# The rough edge: a result's size cap


def test_a_result_over_the_size_cap_is_refused_before_it_is_stored(home: Path) -> None:
    cap = 10_000
    with open_harness(home, policy=Policy(max_result_bytes=cap, per_call_tokens=1000)) as harness:
        task = harness.task("t1")
        text = "é" * (cap // 2)  # exactly at the cap in UTF-8 bytes
        at, over, binary = task.admit(
            [
                ToolResult("c1", "t", text),
                ToolResult("c2", "t", text + "x"),
                ToolResult("c3", "t", b"\0" * (cap + 1)),
            ]
        )
        assert at.offloaded and at.artifact is not None and at.artifact.bytes == cap
        for refused, size in ((over, cap + 1), (binary, cap + 1)):
            assert refused.reason == "refused" and refused.is_error and not refused.offloaded
            assert f"it is {size} bytes, over the {cap}-byte cap" in refused.text
            assert "Policy.max_result_bytes" in refused.text and "\n" not in refused.text
        assert [row.call_id for row in task.artifacts()] == ["c1"]
        with pytest.raises(ConfigError, match="over the 10000-byte cap"):
            task.store_file("big.bin", b"x" * (cap + 1), "sandbox_exec.sh")
        task.close()


def test_the_size_cap_has_a_stated_default_and_an_environment_variable() -> None:
    from spillbox.config import DEFAULT_MAX_RESULT_BYTES, Settings

    assert Policy().max_result_bytes == DEFAULT_MAX_RESULT_BYTES == 256 * 1024 * 1024
    settings = Settings.from_env({"SPILLBOX_MAX_RESULT_BYTES": "1000"})
    assert settings.policy.max_result_bytes == 1000
    with pytest.raises(ConfigError, match="max_result_bytes"):
        Policy(max_result_bytes=0)


def test_the_migration_tells_an_old_catalogs_output_files_from_call_results(home: Path) -> None:
    home.mkdir(parents=True)
    data = Path(__file__).parent / "data" / "catalog_named_migrations.sql"
    with sqlite3.connect(home / CATALOG_FILE) as conn:
        conn.executescript(data.read_text())
        for artifact_id, call_id, tool in (
            ("chart", "chart.png", "sandbox_exec.python"),
            ("exec-sh", "exec-sh", "sandbox_exec.sh"),
        ):
            conn.execute(
                "INSERT INTO artifacts SELECT task_id, ?, ?, ?, name, path, bytes, tokens, "
                "tokens_exact, sha256, created_at, last_access_at, expires_at, state, pinned, "
                "redactions, deleted_at, deleted_by, kind FROM artifacts WHERE artifact_id = 'c1'",
                (artifact_id, call_id, tool),
            )
    catalog = Catalog(home)
    try:
        origins = {row.artifact_id: row.origin for row in catalog.artifacts("kept")}
        assert origins == {"c1": "call", "c2": "call", "chart": "file", "exec-sh": "call"}
    finally:
        catalog.close()


def test_a_number_too_large_for_a_float_is_an_error_result(home: Path) -> None:
    # The docker backend offers sandbox_exec; the call fails before it reaches Docker.
    harness = Harness(sandbox="docker", home=home, environ={}, gc_interval=-1)
    toolset = Toolset(harness.task("t1"))
    args = {"lang": "sh", "code": "echo hi", "artifact": None, "session": None}
    output = toolset.call("sandbox_exec", {**args, "timeout": 10**400, "reset_session": None})
    assert output.is_error
    assert "bad arguments for sandbox_exec" in json.loads(output.text)["error"]
    harness.close()
