"""Fallback compaction under a budget: stages in order, nothing lost, the task always kept."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from conftest import read_all_pages
from spillbox import Harness, Task, parse_notice
from spillbox.budget import Budget, BudgetExceeded, Provider, Route, default_routes
from spillbox.compaction import ARCHIVE_MARK, ARCHIVE_TOOL, Fallback
from spillbox.errors import ConfigError
from spillbox.history import HISTORY_REF
from spillbox.loop import to_anthropic
from spillbox.tools import Toolset

SYSTEM = "You are a careful build engineer."
TASK = "Find which step of the nightly build fails."


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("long-session") as task:
            toolset = Toolset(task)
            task.register_tools(toolset.names)
            yield task


def log(i: int, lines: int = 60) -> str:
    return "".join(f"step {i} line {n}: status ok, retry 0, cache hit\n" for n in range(lines))


def chat_history(steps: int, lines: int = 60) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    for i in range(steps):
        arguments = json.dumps({"step": i})
        call = {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "logs", "arguments": arguments},
        }
        messages.append(
            {"role": "assistant", "content": f"Reading step {i}.", "tool_calls": [call]}
        )
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": log(i, lines)})
    return messages


def responses_items(chat: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for m in chat:
        if m["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
            continue
        items.append({"role": m["role"], "content": m["content"]})
        for call in m.get("tool_calls") or ():
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                }
            )
    return items


def request_for(provider: Provider, chat: list[dict[str, Any]]) -> dict[str, Any]:
    if provider == "chat_completions":
        return {"messages": chat}
    if provider == "responses":
        return {"instructions": SYSTEM, "input": responses_items(chat[1:])}
    system, messages = to_anthropic(chat)
    return {"system": system, "messages": messages}


def budget(history: int, tool_results: int) -> Budget:
    routes = {**default_routes(100_000), "history": history, "tool_results": tool_results}
    return Budget(window=100_000, routes=routes)


def test_tool_results_alone_make_room_when_they_suffice(task: Task) -> None:
    request = request_for("chat_completions", chat_history(10))
    before = copy.deepcopy(request)
    report = budget(20_000, 8_000).check(request, "chat_completions", compactor=Fallback(task))
    assert request == before  # the caller's request is never changed
    assert [s.name for s in report.stages] == ["tool_results"]
    assert report.stages[0].freed > 0
    out = report.request["messages"]
    assert len(out) == len(request["messages"])
    notices = [m for m in out if m["role"] == "tool" and parse_notice(m["content"])]
    assert len(notices) == 7  # all but the last three
    assert not report.needs_room


@pytest.mark.parametrize("provider", ["chat_completions", "responses", "anthropic"])
def test_older_turns_are_archived_and_the_task_stays(task: Task, provider: Provider) -> None:
    chat = chat_history(30, lines=50)
    request = request_for(provider, chat)
    limit = budget(2_500, 2_500)
    report = limit.check(request, provider, compactor=Fallback(task, min_recent=4))
    names = [s.name for s in report.stages]
    assert names[0] == "tool_results" and "archive" in names
    assert all(s.freed > 0 for s in report.stages)
    key = "input" if provider == "responses" else "messages"
    out = report.request[key]
    # the system prompt and the first user message (the task) stay, in place
    if provider == "chat_completions":
        assert out[0] == {"role": "system", "content": SYSTEM}
        out = out[1:]
    else:
        assert report.request.get("system", report.request.get("instructions")) == SYSTEM
    assert out[0] == {"role": "user", "content": TASK}
    notice = out[1]
    assert notice["role"] == "user" and notice["content"].startswith(ARCHIVE_MARK)
    # the kept tail starts a turn: no tool result whose call was archived
    tail = out[2:]
    assert len(tail) >= 4 and _starts_a_turn(tail[0])
    assert not report.needs_room and not report.over_hard
    archived = [a for a in task.artifacts() if a.tool == ARCHIVE_TOOL]
    assert archived, "the archived turns are an artifact of the task"


def _starts_a_turn(first: Mapping[str, Any]) -> bool:
    content = first.get("content")
    is_result = first.get("role") == "tool" or first.get("type") == "function_call_output"
    is_result = is_result or (
        isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
    )
    return not is_result


def test_the_archive_holds_the_moved_messages_byte_for_byte(task: Task) -> None:
    chat = chat_history(30, lines=50)
    report = budget(2_500, 2_500).check({"messages": chat}, "chat_completions", Fallback(task))
    out = report.request["messages"]
    notice = next(m for m in out if str(m["content"]).startswith(ARCHIVE_MARK))
    [artifact] = [a for a in task.artifacts() if a.tool == ARCHIVE_TOOL]
    stored = task.read(artifact).decode("utf-8")
    moved = [json.loads(line) for line in stored.splitlines()]
    # what moved, followed by what stayed, is the conversation after stage a
    kept = out[out.index(notice) + 1 :]
    after_a = moved + kept
    assert after_a[0] == chat[2]  # the first movable message: the first assistant turn
    assert [m.get("tool_call_id") for m in after_a] == [m.get("tool_call_id") for m in chat[2:]]
    toolset = Toolset(task)
    pages = read_all_pages(toolset, path=artifact.path)
    assert [item for _, body in pages for item in body["items"]] == moved


def test_a_summariser_runs_after_the_archive_and_sees_the_archived_originals(task: Task) -> None:
    seen: list[list[Mapping[str, Any]]] = []

    def summarise(messages: Sequence[Mapping[str, Any]]) -> str:
        seen.append(list(messages))
        return f"Steps read so far: {len(messages)} messages, all ok."

    chat = chat_history(30, lines=50)
    compactor = Fallback(task, summarise, min_recent=2, keep_recent=40)
    report = budget(2_500, 2_500).check({"messages": chat}, "chat_completions", compactor)
    names = [s.name for s in report.stages]
    assert names == ["tool_results", "archive", "summary"]  # b stops at keep_recent
    assert seen, "the summariser was called"
    summary = next(
        m for m in report.request["messages"] if "Steps read so far" in str(m["content"])
    )
    assert summary["content"].startswith(ARCHIVE_MARK)
    stored = [
        json.loads(line)
        for a in task.artifacts()
        if a.tool == ARCHIVE_TOOL
        for line in task.read(a).decode("utf-8").splitlines()
    ]
    assert all(m in stored for m in seen[0])  # archived before being summarised


def test_the_backstop_keeps_recent_messages_and_raises(task: Task) -> None:
    chat = chat_history(6, lines=200)
    chat.append({"role": "user", "content": log(99, 400)})  # one huge recent message
    limit = budget(800, 2_000)
    with pytest.raises(BudgetExceeded) as raised:
        limit.check({"messages": chat}, "chat_completions", compactor=Fallback(task, min_recent=4))
    error = raised.value
    assert error.route == "history" and error.limit == 800
    assert [s.name for s in error.report.stages][-1] == "backstop"
    assert "backstop" in str(error)
    assert error.report.request["messages"][-4:] == chat[-4:]
    assert error.report.request["messages"][:2] == chat[:2]


def test_soft_overflow_that_cannot_be_compacted_is_reported_not_raised(task: Task) -> None:
    chat = chat_history(1, lines=30)
    routes = {**default_routes(100_000), "tool_results": Route(5_000, soft=10)}
    report = Budget(window=100_000, routes=routes).check(
        {"messages": chat}, "chat_completions", compactor=Fallback(task, keep_tool_results=1)
    )
    assert report.needs_room and report.stages[-1].name == "backstop"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_recent": -1}, "min_recent must be a whole number"),
        ({"keep_tool_results": 1.5}, "keep_tool_results must be a whole number"),
        ({"min_recent": 8, "keep_recent": 4}, r"keep_recent \(4\) must be at least min_recent"),
        ({"target_share": 0}, "target_share must be above 0"),
    ],
)
def test_bad_settings_name_the_field(task: Task, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Fallback(task, **kwargs)


@pytest.mark.docker
def test_archived_turns_are_searchable_with_sql_and_grep(docker_home: Path) -> None:
    with (
        Harness(sandbox="docker", home=docker_home) as harness,
        harness.task("archive-sql") as task,
    ):
        chat = chat_history(30, lines=50)
        report = budget(2_500, 2_500).check({"messages": chat}, "chat_completions", Fallback(task))
        assert "archive" in [s.name for s in report.stages]
        artifact = task.artifact(HISTORY_REF)  # the newest copy: every archived turn
        assert artifact.tool == ARCHIVE_TOOL
        rows = task.exec(
            "sql",
            f'SELECT role, count(*) AS n FROM "{artifact.artifact_id}" GROUP BY role ORDER BY role',
        )
        assert rows.exit_code == 0, rows.stderr
        moved = [json.loads(line) for line in task.read(artifact).decode().splitlines()]
        roles = sorted({m["role"] for m in moved})
        expected = [f"{r},{sum(m['role'] == r for m in moved)}" for r in roles]
        assert rows.text.splitlines() == ["role,n", *expected]
        grep = task.exec("sh", f"grep -c 'Reading step 3\\.' {artifact.path}")
        assert grep.exit_code == 0, grep.stderr
        assert grep.text.strip() == "1"
