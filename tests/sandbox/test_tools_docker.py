"""The model-facing tools against a real engine: sandbox_exec, and every hint a notice prints,
run as the model would run it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import read_all_pages
from spillbox import Harness, ToolResult, parse_notice
from spillbox.tools import Toolset

pytestmark = pytest.mark.docker


@pytest.fixture
def harness(docker_home: Path) -> Iterator[Harness]:
    with Harness(sandbox="docker", home=docker_home, environ={}, gc_interval=-1) as harness:
        yield harness


PAYLOADS: dict[str, str | bytes] = {
    "arr": json.dumps(
        [{"id": i, "state": "open" if i % 3 else "closed", "body": "x" * 300} for i in range(300)],
        indent=2,
    ),
    "nd": "\n".join(json.dumps({"k": i, "v": "y" * 200}) for i in range(400)),
    "tab": "id,name,score\n" + "\n".join(f"{i},name {i},{i * 7 % 100}" for i in range(3_000)),
    "log": "\n".join(
        f"2024-05-01 line {i} ok" if i % 97 else f"2024-05-01 line {i} ERROR boom"
        for i in range(6_000)
    ),
    "obj": json.dumps({"data": [{"n": i, "s": "z" * 100} for i in range(400)], "meta": {"p": 1}}),
    "bin": b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40,
}


def hints_of(text: str) -> list[tuple[str, dict[str, Any]]]:
    fields = parse_notice(text)
    assert fields is not None, text
    calls = []
    for line in fields.get("hint", "").splitlines():
        name, _, raw = line.partition(" ")
        calls.append((name, json.loads(raw)))
    return calls


def run_every_hint(toolset: Toolset, notice: str, depth: int = 0) -> set[str]:
    """Run each hint of a notice as a tool call; then the hints of any notice that
    comes back (an offloaded print). Returns the tools the hints named."""
    named: set[str] = set()
    hints = hints_of(notice)
    assert hints, notice
    for name, args in hints:
        assert name in toolset.names, name
        named.add(name)
        output = toolset.call(name, args)
        assert not output.is_error, (name, args, output.text)
        body = json.loads(output.text)
        if name == "sandbox_exec":
            assert body["exit_code"] == 0 and not body["timed_out"], body
            assert body["output"].strip(), (args, body)
            if parse_notice(body["output"]) is not None and depth == 0:
                run_every_hint(toolset, body["output"], depth + 1)
        else:
            assert body["path"] == parse_notice(notice)["path"]  # type: ignore[index]
            assert body.get("items") or body.get("text") or body.get("envelope")
    return named


def test_the_toolset_offers_sandbox_exec_with_docker(harness: Harness) -> None:
    with harness.task("defs") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        assert toolset.names == (
            "sandbox_exec",
            "read_artifact",
            "list_artifacts",
            "search_artifacts",
        )
        names = [d["name"] for d in toolset.definitions("anthropic")]
        assert names == list(toolset.names)


def test_before_registration_hints_are_plain_code(harness: Harness) -> None:
    with harness.task("plain") as task:
        admitted = task.admit(
            [ToolResult(call_id=k, tool="t", content=v) for k, v in PAYLOADS.items()]
        )
        for item in admitted:
            assert item.offloaded, item.call_id
            lines = parse_notice(item.text)["hint"].splitlines()  # type: ignore[index]
            assert lines, item.call_id
            for line in lines:
                assert line.split(":", 1)[0] in ("sql", "sh"), line
            assert "read_artifact" not in item.text and "sandbox_exec" not in item.text


def test_every_hint_a_notice_prints_runs(harness: Harness) -> None:
    with harness.task("hints") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        admitted = task.admit(
            [ToolResult(call_id=k, tool="t", content=v) for k, v in PAYLOADS.items()]
        )
        for item in admitted:
            assert item.offloaded, item.call_id
            named = run_every_hint(toolset, item.text)
            assert named == {"sandbox_exec", "read_artifact"}, (item.call_id, named)


def test_a_print_too_big_for_context_comes_back_as_a_notice_whose_hints_run(
    harness: Harness,
) -> None:
    with harness.task("print") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        task.admit([ToolResult(call_id="arr", tool="t", content=PAYLOADS["arr"])])
        output = toolset.call("sandbox_exec", {"lang": "sql", "code": 'SELECT * FROM "arr"'})
        assert not output.is_error, output.text
        printed = json.loads(output.text)["output"]
        fields = parse_notice(printed)
        assert fields is not None, printed
        assert run_every_hint(toolset, printed) == {"sandbox_exec", "read_artifact"}


def test_a_hint_still_runs_when_a_log_has_no_error_line(harness: Harness) -> None:
    quiet = "\n".join(f"2024-05-01 line {i} ok" for i in range(6_000))
    with harness.task("quiet") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        [item] = task.admit([ToolResult(call_id="quiet", tool="t", content=quiet)])
        run_every_hint(toolset, item.text)


def test_sandbox_exec_as_the_model_calls_it(harness: Harness) -> None:
    with harness.task("exec") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        task.admit([ToolResult(call_id="arr", tool="t", content=PAYLOADS["arr"])])

        def call(args: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
            output = toolset.call("sandbox_exec", args)
            return output.is_error, json.loads(output.text)

        error, body = call(
            {"lang": "jq", "code": '[.[] | select(.state == "closed")] | length', "artifact": "arr"}
        )
        assert not error and body["output"].strip() == "100"
        error, body = call({"lang": "python", "code": "import duckdb, jq, pyarrow; print(6 * 7)"})
        assert not error and body["output"].strip() == "42"
        error, body = call({"lang": "python", "code": "raise SystemExit('bad input: fix it')"})
        assert error and body["exit_code"] == 1 and "bad input" in body["stderr"]
        error, body = call({"lang": "sh", "code": "sleep 30", "timeout": 1})
        assert error and body["timed_out"] is True
        error, body = call({"lang": "cobol", "code": "DISPLAY 1"})
        assert error and "unknown language 'cobol'" in body["error"]
        error, body = call({"lang": "sql", "code": "SELECT 1", "network": True})
        assert error and "unknown argument(s) network" in body["error"]
        error, body = call({"lang": "jq", "code": "."})
        assert error and "artifact" in body["error"]


def test_read_artifact_and_list_artifacts_use_sandbox_paths(harness: Harness) -> None:
    with harness.task("paths") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        task.admit([ToolResult(call_id="arr", tool="list_prs", content=PAYLOADS["arr"])])
        [row] = json.loads(toolset.call("list_artifacts", {}).text)
        assert row["path"] == "/sandbox/offload/arr.json" and row["tool"] == "list_prs"
        pages = [body for _, body in read_all_pages(toolset, path=row["path"])]
        assert [i for p in pages for i in p["items"]] == json.loads(PAYLOADS["arr"])  # type: ignore[arg-type]
