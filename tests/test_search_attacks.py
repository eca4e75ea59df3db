"""search_artifacts (issue 25 item 3): found, ranked, bounded, and hostile input refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import spillbox.search
from spillbox import Harness, Policy, Task
from spillbox.search import MAX_QUERY_CHARS, MAX_TOP_K, SNIPPET_CHARS, search
from spillbox.tools import SPECS, Toolset
from spillbox.types import ToolResult


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("search") as task:
            yield task


def stored(task: Task, call_id: str, content: str | bytes) -> str:
    admitted = task.offload(ToolResult(call_id, "dump", content))
    assert admitted.artifact is not None
    return admitted.artifact.id


def call(toolset: Toolset, **args: Any) -> dict[str, Any]:
    output = toolset.call("search_artifacts", {"top_k": None, "artifact": None, **args})
    body: dict[str, Any] = json.loads(output.text)
    assert not output.offloadable  # bounded like a page: never offloaded again
    return body


def test_the_schema_is_strict_mode_valid() -> None:
    spec = SPECS["search_artifacts"]
    params = spec.parameters
    assert spec.strict and params["additionalProperties"] is False
    assert params["required"] == list(params["properties"])
    assert params["properties"]["top_k"]["type"] == ["integer", "null"]


def test_lines_with_every_word_are_found_with_their_positions(task: Task) -> None:
    stored(task, "twice", "timeout after timeout\n")  # the oldest, but two matches
    log = "".join(f"line {i}: ok\n" for i in range(5000)) + "line 5000: Timeout in Step 7\n"
    stored(task, "log", log)
    stored(task, "rows", "\n".join(json.dumps({"n": i, "note": "timeout"}) for i in range(3)))
    body = call(Toolset(task), query="step TIMEOUT")
    [hit] = body["results"]
    assert (hit["artifact_id"], hit["line"]) == ("log", 5000)
    assert hit["snippet"] == "line 5000: Timeout in Step 7"
    assert hit["offset"] == len("line 5000: ")
    # The word alone matches five lines: more occurrences first, then the newest artifact,
    # then the earliest line; what top_k leaves out is counted.
    three = call(Toolset(task), query="timeout", top_k=3)
    assert [(h["artifact_id"], h["line"]) for h in three["results"]] == [
        ("twice", 0),
        ("rows", 0),
        ("rows", 1),
    ]
    assert three["matched_lines"] == 5 and three["more"] is True


def test_a_line_separator_inside_a_record_does_not_shift_positions(task: Task) -> None:
    records = [{"text": "a\u2028b\x85c\x1cd"}, {"text": "needle here"}]
    stored(task, "nd", "\n".join(json.dumps(r, ensure_ascii=False) for r in records) + "\n")
    [hit] = call(Toolset(task), query="needle")["results"]
    assert hit["line"] == 1  # the record's index, as read_artifact counts it


def test_the_answer_stays_under_the_per_call_limit(home: Path) -> None:
    policy = Policy(per_call_tokens=600)
    with Harness(sandbox="none", home=home, policy=policy, gc_interval=-1) as harness:
        with harness.task("small") as task:
            stored(task, "big", "".join(f"match {i} " + "x" * 900 + "\n" for i in range(200)))
            body = call(Toolset(task), query="match", top_k=MAX_TOP_K)
            assert task.counter.count(json.dumps(body, ensure_ascii=False)) <= 600
    assert 0 < body["shown"] < MAX_TOP_K and body["more"] is True
    assert all(len(h["snippet"]) <= SNIPPET_CHARS for h in body["results"])


def test_binary_artifacts_are_not_searched_and_the_scan_is_bounded(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored(task, "png", b"\x89PNG\r\n\x1a\n" + b"needle" * 10)
    stored(task, "a", "needle one\n" * 3)
    stored(task, "b", "needle two\n" * 3)
    monkeypatch.setattr(spillbox.search, "MAX_SCAN_BYTES", 40)
    body = search(task, "needle")
    # The newest text artifact fits the bound; the older one is named, not silently left.
    assert {h["artifact_id"] for h in body["results"]} == {"b"}
    assert body["not_searched"]["artifacts"] == ["a"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"query": ""}, "query must be a non-empty string"),
        ({"query": "   "}, "query must be a non-empty string"),
        ({"query": "x" * (MAX_QUERY_CHARS + 1)}, f"at most {MAX_QUERY_CHARS}"),
        ({"query": "x", "top_k": 0}, "top_k must be a whole number"),
        ({"query": "x", "top_k": MAX_TOP_K + 1}, "top_k must be a whole number"),
        ({"query": "x", "top_k": True}, "top_k must be a whole number"),
        ({"query": "x", "artifact": "nope"}, "has no artifact 'nope'"),
        ({"query": "x", "extra": 1}, "unknown argument(s) extra"),
    ],
)
def test_hostile_arguments_get_one_line_errors(
    task: Task, args: dict[str, Any], error: str
) -> None:
    stored(task, "a", "x\n")
    output = Toolset(task).call("search_artifacts", args)
    message = json.loads(output.text)["error"]
    assert output.is_error and error in message and "\n" not in message
    assert task.read("a") == b"x\n"  # nothing touched
