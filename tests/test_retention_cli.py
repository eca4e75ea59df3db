"""The retention commands of the CLI: flags, --json output, and one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from spillbox import cli
from spillbox.retention import Retention


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SPILLBOX_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SPILLBOX_PER_CALL_TOKENS", "50")
    monkeypatch.setenv("SPILLBOX_SANDBOX", "none")


class Cli:
    def __init__(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.home = home
        self.capsys = capsys

    def run(self, *args: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = cli.main([*args, "--home", str(self.home)])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *args: str) -> Any:
        code, out, err = self.run(*args, "--json")
        assert code == 0, err
        assert err == ""
        return json.loads(out)

    def error(self, *args: str) -> str:
        """Run a command that must fail: non-zero exit, one line on stderr, nothing on stdout."""
        code, out, err = self.run(*args)
        assert code != 0
        assert out == ""
        assert err.endswith("\n") and err.count("\n") == 1, err
        assert err.startswith("spillbox: error: ")
        return err


@pytest.fixture
def sb(home: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(home, capsys)


def write_payload(folder: Path, name: str, tag: str = "") -> Path:
    path = folder / name
    rows = [{"id": i, "tag": tag or name, "body": f"row {i}"} for i in range(40)]
    path.write_text(json.dumps(rows))
    return path


def offload_json(sb: Cli, *args: str) -> list[Any]:
    code, out, err = sb.run("offload", *args, "--json")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_offload_with_retention_flags_stores_the_policy(sb: Cli, tmp_path: Path) -> None:
    f1 = write_payload(tmp_path, "a.json")
    f2 = write_payload(tmp_path, "b.json")
    items = offload_json(
        sb,
        "--task", "t1", "--ttl", "24h", "--ttl-from", "access", "--keep-after-close", "7d",
        "--max-bytes", "20M", "--max-artifacts", "50", "--on-quota", "refuse",
        "--export", "allow", "--redact", str(f1), str(f2),
    )  # fmt: skip
    assert [(i["call_id"], i["offloaded"]) for i in items] == [("a", True), ("b", True)]
    [task] = sb.json("tasks")
    assert task["task"] == "t1" and task["artifacts"] == 2
    assert Retention(**task["retention"]) == Retention(
        ttl=86400,
        ttl_from="access",
        keep_after_close=7 * 86400,
        max_bytes=20 * 1024**2,
        max_artifacts=50,
        on_quota="refuse",
        export="allow",
        redact=True,
    )
    # A later use without flags keeps the stored policy.
    offload_json(sb, "--task", "t1", str(write_payload(tmp_path, "c.json")))
    [task] = sb.json("tasks")
    assert task["retention"]["ttl"] == 86400 and task["artifacts"] == 3


def test_every_command_speaks_json(sb: Cli, tmp_path: Path) -> None:
    offload_json(sb, "--task", "t1", "--export", "allow", str(write_payload(tmp_path, "c1")))
    offload_json(sb, "--task", "t1", str(write_payload(tmp_path, "c2")))

    [task] = sb.json("tasks")
    assert (task["task"], task["state"], task["artifacts"]) == ("t1", "closed", 2)

    artifacts = sb.json("artifacts", "t1")
    assert [a["id"] for a in artifacts] == ["c1", "c2"]
    assert all(a["state"] == "live" and len(a["sha256"]) == 64 for a in artifacts)

    pinned = sb.json("pin", "t1", "c1")
    assert pinned["id"] == "c1" and pinned["pinned"] is True
    assert sb.json("unpin", "t1", "c1")["pinned"] is False

    dest = tmp_path / "out.json"
    exported = sb.json("export", "t1", "c1", str(dest))
    assert exported == {"exported": "c1", "dest": str(dest)}
    assert dest.read_bytes() == (tmp_path / "c1").read_bytes()

    assert sb.json("gc", "--dry-run") == []
    assert sb.json("gc") == []

    audit = sb.json("audit", "t1")
    actions = [e["action"] for e in audit]
    assert actions == ["offload", "offload", "pin", "unpin", "export"]
    assert audit[-1]["detail"] == str(dest) and audit[-1]["actor"].startswith("cli:")

    assert sb.json("rm", "t1") == {"removed": "t1", "pinned_kept": 0}
    assert sb.json("tasks") == []
    tombstones = sb.json("artifacts", "t1", "--all")
    assert [(a["id"], a["state"], a["deleted_by"]) for a in tombstones] == [
        ("c1", "deleted", "manual"),
        ("c2", "deleted", "manual"),
    ]
    assert sb.json("artifacts", "t1") == []


def test_artifacts_are_named_by_id_or_call_id(sb: Cli, tmp_path: Path) -> None:
    [item] = offload_json(sb, "--task", "t1", str(write_payload(tmp_path, "call.7.json")))
    [row] = sb.json("artifacts", "t1")
    assert row["call_id"] == "call.7"
    assert sb.json("pin", "t1", "call.7")["id"] == row["id"]
    assert sb.json("unpin", "t1", row["id"])["pinned"] is False
    assert item["path"] == row["path"]


def test_gc_reports_what_it_removes(sb: Cli, tmp_path: Path) -> None:
    offload_json(sb, "--task", "t1", "--ttl", "0s", str(write_payload(tmp_path, "c1")))
    would = sb.json("gc", "--dry-run")
    assert [(r["kind"], r["task_id"], r["what"], r["reason"]) for r in would] == [
        ("artifact", "t1", "c1", "ttl")
    ]
    code, out, _ = sb.run("gc", "--dry-run")
    assert code == 0 and out == "would remove artifact c1 (ttl)\n"
    code, out, _ = sb.run("gc")
    # The CLI closed the task; kept until its artifacts expired, it goes with the last.
    assert code == 0 and out == "removed artifact c1 (ttl)\nremoved task t1 (expired)\n"
    code, out, _ = sb.run("gc")
    assert code == 0 and out == "nothing to remove\n"


def test_gc_of_a_home_that_is_not_there_changes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "no" / "such" / "home"
    for args in (["--dry-run"], []):
        err = Cli(missing, capsys).error("gc", *args)
        assert f"no spillbox home at {missing}: nothing to collect" in err
        assert not (tmp_path / "no").exists()


def test_pinned_artifacts_are_reported_by_rm(sb: Cli, tmp_path: Path) -> None:
    offload_json(sb, "--task", "t1", str(write_payload(tmp_path, "c1")))
    offload_json(sb, "--task", "t1", str(write_payload(tmp_path, "c2")))
    sb.json("pin", "t1", "c2")
    assert sb.json("rm", "t1") == {"removed": "t1", "pinned_kept": 1}
    assert [a["id"] for a in sb.json("artifacts", "t1")] == ["c2"]
    code, out, _ = sb.run("rm", "t1")
    assert code == 0 and "1 pinned artifacts kept under legal hold" in out


def test_text_output_is_one_line_per_item(sb: Cli, tmp_path: Path) -> None:
    offload_json(sb, "--task", "t1", str(write_payload(tmp_path, "c1")))
    for args, expect in (
        (("tasks",), "t1\tclosed\t1 artifacts"),
        (("artifacts", "t1"), "c1\tlive\t"),
        (("pin", "t1", "c1"), "pinned c1"),
        (("audit", "t1"), "\tpin\tc1\tcli:"),
    ):
        code, out, err = sb.run(*args)
        assert code == 0 and err == ""
        assert expect in out


def test_text_output_escapes_ids_that_would_forge_a_line(sb: Cli) -> None:
    """Ids come from models and tools: a newline, a tab or U+2028 in one must not make a
    line (or a column) of its own in the text an operator reads; --json keeps them exact."""
    from spillbox import Harness, Policy, ToolResult

    task_id = "t\n1\u2028x\t"
    call_id = "c1\n2026-12-04T00:00:00+00:00\tdelete\tc9\tretention\tforged"
    payload = json.dumps([{"id": i, "body": f"row {i}"} for i in range(40)])
    with Harness(sandbox="none", home=sb.home, policy=Policy(per_call_tokens=50)) as harness:
        with harness.task(task_id) as task:
            [admitted] = task.admit(
                [ToolResult(call_id=call_id, tool="to\u2028ol", content=payload)]
            )
    assert admitted.offloaded
    for args, rows in ((("tasks",), 1), (("artifacts", task_id), 1), (("audit", task_id), 1)):
        code, out, err = sb.run(*args)
        assert code == 0 and err == ""
        lines = out.splitlines()
        assert len(lines) == rows, out
        assert all(line.count("\t") == lines[0].count("\t") for line in lines)
        assert "\u2028" not in out and "forged" not in out.split("\t", 1)[0]
    assert repr(task_id) in sb.run("tasks")[1]
    assert sb.json("tasks")[0]["task"] == task_id
    assert [entry["detail"] for entry in sb.json("audit", task_id)] == [call_id]


def test_quota_refusal_is_a_one_line_error(sb: Cli, tmp_path: Path) -> None:
    offload_json(
        sb, "--task", "t1", "--max-artifacts", "1", "--on-quota", "refuse",
        str(write_payload(tmp_path, "c1")),
    )  # fmt: skip
    err = sb.error("offload", "--task", "t1", str(write_payload(tmp_path, "c2")))
    assert "quota" in err
    assert [a["id"] for a in sb.json("artifacts", "t1")] == ["c1"]


def test_errors_are_one_line_with_a_non_zero_exit(sb: Cli, tmp_path: Path) -> None:
    source = write_payload(tmp_path, "c1")
    offload_json(sb, "--task", "t1", str(source))
    existing = tmp_path / "existing.json"
    existing.write_text("keep me")

    assert "denied by the retention policy" in sb.error("export", "t1", "c1", str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
    assert "export_denied" in [e["action"] for e in sb.json("audit", "t1")]
    assert "no task 'nope'" in sb.error("artifacts", "nope")
    assert "no task 'nope'" in sb.error("export", "nope", "c1", str(tmp_path / "y"))
    assert "no artifact 'zzz'" in sb.error("pin", "t1", "zzz")
    assert "bad duration" in sb.error("offload", "--task", "t2", "--ttl", "soon", str(source))
    assert "bad size" in sb.error("offload", "--task", "t2", "--max-bytes", "lots", str(source))
    assert "whole number" in sb.error(
        "offload", "--task", "t2", "--max-artifacts", "x", str(source)
    )
    assert "cannot read" in sb.error("offload", "--task", "t2", str(tmp_path / "missing"))
    assert "code mode needs a sandbox" in sb.error("exec", "--task", "t1", "--lang", "sh", "ls")

    offload_json(sb, "--task", "t1", "--export", "allow", str(write_payload(tmp_path, "c9")))
    assert "already exists" in sb.error("export", "t1", "c9", str(existing))
    assert existing.read_text() == "keep me"
    missing = tmp_path / "no" / "such" / "folder" / "out.json"
    assert "cannot export to" in sb.error("export", "t1", "c9", str(missing))
    assert not missing.parent.exists()

    sb.json("rm", "t1")
    sb.json("tasks")
    offload_json(sb, "--task", "t1", str(write_payload(tmp_path, "other")))  # the task again
    err = sb.error("pin", "t1", "c1")
    assert "deleted at " in err and "by policy manual" in err


def test_json_errors_are_still_one_line_on_stderr(sb: Cli) -> None:
    code, out, err = sb.run("audit", "t1", "--json")
    assert code != 0 and out == "" and err.count("\n") == 1 and "no task" in err
    code, out, err = sb.run("artifacts", "nope", "--json")
    assert code != 0 and out == "" and err.count("\n") == 1
