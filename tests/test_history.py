"""One history per task (issue 25 item 3) and every turn kept (item 4)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from spillbox import Harness, Task
from spillbox.budget import Budget
from spillbox.compaction import Fallback
from spillbox.history import HISTORY_REF, HISTORY_TOOL, History
from spillbox.loop import ScriptedModel, ToolCall, Turn, UserTool, run
from spillbox.tools import Toolset, ToolSpec

LOGS = ToolSpec(
    "logs",
    "A step's build log.",
    {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]},
)


def log_tool(arguments: Mapping[str, Any]) -> str:
    """About 2,000 tokens per step, each different."""
    step = int(arguments["step"])
    return "".join(f"step {step} unit {n}: compiled in {n * 7 % 900} ms\n" for n in range(190))


def steps(n: int) -> ScriptedModel:
    """A model that asks for logs 0 to n-1, one a call, then answers (whatever moved out of
    the conversation in between)."""
    asked = iter(range(n))

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        step = next(asked, None)
        if step is None:
            return Turn("All steps read.")
        return Turn("", (ToolCall(f"s{step}", "logs", {"step": step}),))

    return ScriptedModel(script)


def _archived(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith("[spillbox: earlier turns archived]")


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("forty") as task:
            yield task


def history_lines(task: Task) -> list[dict[str, Any]]:
    # One record a line, as NDJSON has it: "\n" alone ends one (not U+2028 inside a string).
    return [json.loads(line) for line in task.read(HISTORY_REF).decode().split("\n") if line]


def test_a_long_session_keeps_one_history_that_every_archive_appends_to(task: Task) -> None:
    # The session, 40 steps in a 32k window, with routes of their own (no shared
    # room), so the archive stage runs again and again.
    budget = Budget(window=32_000, share_room=False)
    model = steps(40)
    result = run(task, model, "Read forty logs.", [UserTool(LOGS, log_tool)], max_steps=45,
                 budget=budget, compactor=Fallback(task))  # fmt: skip
    assert result.answer == "All steps read."
    archives = [s for r in result.reports for s in r.stages if s.name == "archive"]
    assert len(archives) > 3
    # One artifact, appended to: no chain to walk back through.
    [newest] = [row for row in task.artifacts() if row.tool == HISTORY_TOOL]
    assert task.artifact(HISTORY_REF).artifact_id == newest.artifact_id
    lines = history_lines(task)
    # The first tool call of the session is in it, and one search finds it.
    assert any(m.get("tool_calls", [{}])[0].get("id") == "s0" for m in lines if m.get("tool_calls"))
    found = json.loads(
        Toolset(task).call("search_artifacts", {"query": '"id": "s0"', "top_k": 50,
                                                "artifact": None}).text
    )  # fmt: skip
    assert {h["artifact_id"] for h in found["results"]} == {newest.artifact_id}
    # Each archive's message names the history by its stable reference and line span.
    notices = [m["content"] for m in result.messages if _archived(m)]
    assert notices and f"of '{HISTORY_REF}'" in notices[-1]


def test_each_append_keeps_the_earlier_lines_byte_for_byte(task: Task) -> None:
    history = History(task)
    first = history.append([{"role": "user", "content": 'one\u2028line\r\n"quoted" 日志'}])
    before = task.read(HISTORY_REF)
    # Breaks JSON may leave raw (DuckDB's NDJSON reader and str.splitlines end a line at
    # them) are escaped: one record, one line, to every reader.
    assert "\u2028".encode() not in before and before.count(b"\n") == 1
    second = History(task).append([{"role": "assistant", "content": "two"}])  # another instance
    after = task.read(HISTORY_REF)
    assert after.startswith(before) and after.count(b"\n") == 2
    assert (first.first, first.last, second.first, second.last) == (0, 0, 1, 1)
    assert first.artifact_id == second.artifact_id == task.artifact(HISTORY_REF).artifact_id
    # The first History follows the second's append instead of overwriting it.
    third = history.append([{"role": "user", "content": "three"}])
    assert (third.first, third.last) == (2, 2)
    assert [m["content"] for m in history_lines(task)][1:] == ["two", "three"]


def test_a_known_turn_is_not_stored_twice(task: Task) -> None:
    turn = {"role": "user", "content": "once"}
    history = History(task)
    history.append([turn])
    span = history.append([turn, {"role": "assistant", "content": "new"}], skip_known=True)
    assert (span.first, span.last) == (0, 1)
    assert [m["content"] for m in history_lines(task)] == ["once", "new"]


def test_record_turns_keeps_every_turn_of_the_loop(task: Task) -> None:
    result = run(task, steps(3), "Read three logs.", [UserTool(LOGS, log_tool)],
                 system="Be careful.", record_turns=True)  # fmt: skip
    assert history_lines(task) == result.messages  # every turn, in order, the answer last


def test_turns_before_a_failed_call_are_recorded(task: Task) -> None:
    calls: list[int] = []

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("the endpoint fell over")
        return Turn("", (ToolCall(f"s{len(calls)}", "logs", {"step": len(calls)}),))

    with pytest.raises(RuntimeError):
        run(task, ScriptedModel(script), "go", [UserTool(LOGS, log_tool)], record_turns=True)
    lines = history_lines(task)
    assert [m["role"] for m in lines] == ["user", "assistant", "tool", "assistant", "tool"]


def test_recorded_turns_are_not_archived_twice(task: Task) -> None:
    budget = Budget(window=32_000, share_room=False)
    run(task, steps(12), "Read twelve logs.", [UserTool(LOGS, log_tool)], max_steps=15,
        budget=budget, record_turns=True)  # fmt: skip
    lines = [json.dumps(m, sort_keys=True) for m in history_lines(task)]
    recorded = [line for line in lines if not line.startswith('{"content": "[spillbox')]
    # Stage a's notices stand for results already recorded whole: new lines, but no line
    # of the history is there twice.
    assert len(recorded) == len(set(recorded))


def test_the_toolset_reads_and_searches_the_history(task: Task) -> None:
    History(task).append(
        [
            {"role": "user", "content": "Which test is flaky?"},
            {"role": "assistant", "content": "the flaky test is test_timeout_9"},
        ]
    )
    toolset = Toolset(task)
    page = json.loads(toolset.call("read_artifact", {"artifact_id": HISTORY_REF}).text)
    assert page["items"][1]["content"] == "the flaky test is test_timeout_9"
    found = json.loads(toolset.call("search_artifacts", {"query": "TEST_TIMEOUT_9"}).text)
    [hit] = found["results"]
    assert hit["tool"] == HISTORY_TOOL and hit["line"] == 1
