"""Records wrapped in an object (GitHub search, Slack history, a GraphQL connection, and
payloads of 40 MB): every hint of their notices run in a real sandbox, and what each
gives checked against the payload: the SQL hint one row per record (the records' own
table), the jq hints the
records at the path and the envelope without them."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api_shapes import SHAPES, at_least, github_search
from spillbox import Harness, ToolResult, codemode, parse_notice
from spillbox.tools import Toolset

pytestmark = pytest.mark.docker


@pytest.fixture
def harness(docker_home: Path) -> Iterator[Harness]:
    with Harness(sandbox="docker", home=docker_home, environ={}, gc_interval=-1) as harness:
        yield harness


def at_path(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def without(value: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    key, *rest = path
    if not rest:
        return {k: v for k, v in value.items() if k != key}
    return {**value, key: without(value[key], tuple(rest))}


def check_hints(
    task: Any, call_id: str, text: str, value: Any, path: tuple[str, ...]
) -> dict[str, str]:
    """Run the notice's hints and check each against the payload; the notice's fields."""
    [admitted] = task.admit([ToolResult(call_id=call_id, tool="api", content=text)])
    fields = parse_notice(admitted.text)
    assert fields is not None and admitted.offloaded, admitted.text
    records = at_path(value, path)
    assert fields["records"].split(", ")[0] == ".".join(path)
    sql, jq_records, jq_envelope = fields["hint"].splitlines()
    assert sql.startswith("sql: SELECT * FROM ") and jq_records.startswith("sh: jq ")

    rows = task.exec("sql", sql.removeprefix("sql: "), timeout=120)
    assert rows.exit_code == 0, rows.stderr
    table = list(csv.DictReader(io.StringIO(rows.text)))
    assert len(table) == 5
    assert set(table[0]) == set(records[0]), "one column per key of the records"
    first_key = next(iter(records[0]))
    assert [row[first_key] for row in table] == [str(r[first_key]) for r in records[:5]]

    # One row per record: the hint without its LIMIT, counted.
    whole = sql.removeprefix("sql: ").removesuffix(" LIMIT 5")
    counted = task.exec("sql", f"SELECT count(*) AS n FROM ({whole})", timeout=120)
    assert counted.exit_code == 0, counted.stderr
    assert counted.text.splitlines() == ["n", str(len(records))]

    shown = task.exec("sh", jq_records.removeprefix("sh: "), timeout=120)
    assert shown.exit_code == 0, shown.stderr
    assert [json.loads(line) for line in shown.text.splitlines()] == records[:2]

    envelope = task.exec("sh", jq_envelope.removeprefix("sh: "), timeout=120)
    assert envelope.exit_code == 0, envelope.stderr
    assert json.loads(envelope.text) == without(value, path)
    return fields


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_hint_of_a_wrapped_payload_runs_and_gives_the_records(
    harness: Harness, name: str
) -> None:
    builder, path, _ = SHAPES[name]
    value = builder(400)
    with harness.task(f"wrapped-{name}".replace("_", "-")) as task:
        check_hints(task, name, json.dumps(value, indent=2), value, path)


def test_the_hints_of_a_scanned_payload_with_two_arrays_run(harness: Harness) -> None:
    # Over the profile's 256 KB head and within its scan budget: every key named, the
    # records counted exactly (not "about"), and the hints walk the larger array.
    value = github_search(6_000)
    value["warnings"] = [{"code": i, "message": "secondary rate limit"} for i in range(3)]
    value["next"] = "https://api.github.com/search/issues?page=2"
    text = json.dumps(value)
    assert len(text) > 1024 * 1024
    with harness.task("wrapped-scanned") as task:
        fields = check_hints(task, "two", text, value, ("items",))
    assert fields["shape"] == "JSON object with 5 keys"
    assert json.loads(fields["keys"]) == list(value)
    assert fields["records"] == "items, 6,000 objects"


@pytest.mark.parametrize("megabytes", [40, 72])
def test_the_hints_of_a_large_wrapped_payload_run(harness: Harness, megabytes: int) -> None:
    """72 MB: past the 64 MiB that DuckDB's JSON reader was once bounded to, one object."""
    builder, path, _ = SHAPES["slack_history"]
    text, count = at_least(builder, megabytes * 1024 * 1024)
    value = json.loads(text)
    with harness.task("wrapped-large") as task:
        [admitted] = task.admit([ToolResult(call_id="big", tool="api", content=text)])
        fields = parse_notice(admitted.text)
        assert fields is not None
        assert fields["records"].startswith("messages, about ")
        assert fields["shape"] == f"JSON object with {len(value)} keys"
        assert json.loads(fields["keys"]) == list(value)
        check_hints(task, "big", text, value, path)
        assert len(at_path(value, path)) == count


@pytest.mark.parametrize("name", list(SHAPES))
def test_the_streaming_jq_hints_give_what_the_whole_ones_do(
    harness: Harness, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past JQ_WHOLE_MAX_BYTES the jq hints read --stream events (jq 1.6 parsing a 72 MB
    document whole was killed at the memory limit); here at every size, for each shape,
    the GraphQL one four keys deep."""
    monkeypatch.setattr(codemode, "JQ_WHOLE_MAX_BYTES", 0)
    builder, path, _ = SHAPES[name]
    value = builder(300)
    with harness.task(f"streamed-{name}") as task:
        fields = check_hints(task, "api", json.dumps(value, indent=1), value, path)
    assert all("--stream" in hint for hint in fields["hint"].splitlines()[1:])


def test_the_tool_hints_of_a_wrapped_payload_run(harness: Harness) -> None:
    builder, path, envelope_key = SHAPES["graphql"]
    value = builder(300)
    with harness.task("wrapped-tools") as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        [admitted] = task.admit([ToolResult(call_id="prs", tool="api", content=json.dumps(value))])
        fields = parse_notice(admitted.text)
        assert fields is not None
        hints = [line.partition(" ") for line in fields["hint"].splitlines()]
        assert [name for name, _, _ in hints] == ["sandbox_exec", "read_artifact"]
        exec_output = toolset.call("sandbox_exec", json.loads(hints[0][2]))
        body = json.loads(exec_output.text)
        assert body["exit_code"] == 0 and len(body["output"].splitlines()) == 6, body
        page = json.loads(toolset.call("read_artifact", json.loads(hints[1][2])).text)
        assert page["unit"] == "envelope" and page["records"] == ".".join(path)
        assert page["position"] == {"start": 0, "end": 0} and page["total"] == 300
        assert envelope_key in page["envelope"]
