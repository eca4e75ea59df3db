"""Reversible history compaction: older tool results move out, notices stay, nothing is lost."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import joined_text, read_all_pages
from spillbox import Harness, Task, parse_notice
from spillbox.adapters import compact_history
from spillbox.tools import Toolset

IMAGE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
}


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("long-chat") as task:
            yield task


def result_text(i: int) -> str:
    """The i-th tool result: a log of 1,000-9,000 tokens (the later ones span pages when
    read back), each different, with bytes that JSON escapes."""
    lines = [f'step {i} line {n}: "value" \\ path\tok 日志 ✓\r\n' for n in range(50 + 40 * i)]
    return "".join(lines) + f"end of result {i}"


def read_back(toolset: Toolset, path: str) -> str:
    """The whole artifact at path, through read_artifact, page after page."""
    return joined_text(read_pages(toolset, path))


def read_pages(toolset: Toolset, path: str) -> list[dict[str, Any]]:
    # The results have a tab a line: the profile takes them for TSV, whose pages after the
    # first repeat the header (joined_text drops the repeats).
    return [body for _, body in read_all_pages(toolset, path=path)]


def chat_history(n: int = 10) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Find the failing step."},
    ]
    for i in range(n):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": f"logs_{i}"}}
        call["function"]["arguments"] = json.dumps({"step": i})
        messages.append({"role": "assistant", "content": f"Checking {i}.", "tool_calls": [call]})
        content = "tiny" if i == 1 else result_text(i)  # one old result is under min_tokens
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": content})
    messages.append({"role": "assistant", "content": "Step 7 failed."})
    return messages


def test_older_results_become_notices_that_read_artifact_opens_again(task: Task) -> None:
    toolset = Toolset(task)
    task.register_tools(toolset.names)
    messages = chat_history()
    before = copy.deepcopy(messages)
    out = compact_history(task, messages, keep_last=3)
    assert messages == before  # the caller's history is not touched
    assert len(out) == len(messages)
    tool_at = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    assert len(tool_at) == 10
    moved = [i for i in tool_at[:7] if messages[i]["content"] != "tiny"]
    pages = 0
    for i, (new, old) in enumerate(zip(out, messages, strict=True)):
        if i not in moved:
            assert new == old  # nothing else changes: kept results, tiny ones, every message
            continue
        assert set(new) == set(old) and new["tool_call_id"] == old["tool_call_id"]
        fields = parse_notice(new["content"])
        assert fields is not None, new["content"]
        assert fields["reason"].startswith("compaction")
        assert fields["tool"] == f"logs_{tool_at.index(i)}"
        assert fields["sha256"] == hashlib.sha256(old["content"].encode()).hexdigest()
        assert fields["hint"] == f"read_artifact {json.dumps({'path': fields['path']})}"
        texts = read_pages(toolset, fields["path"])
        assert joined_text(texts).encode() == old["content"].encode()
        pages = max(pages, len(texts))
    assert len(moved) == 6 and len(task.artifacts()) == 6
    assert pages > 1  # the larger ones took more than one page


def test_compaction_is_idempotent_and_keeps_what_it_is_told(task: Task) -> None:
    once = compact_history(task, chat_history(), keep_last=3)
    twice = compact_history(task, once, keep_last=3)
    assert twice == once and len(task.artifacts()) == 6  # notices stay, no new artifacts
    kept_all = compact_history(task, chat_history(), keep_last=10)
    assert kept_all == chat_history()
    small = compact_history(task, chat_history(), keep_last=0, min_tokens=10**9)
    assert small == chat_history()


def test_min_tokens_is_exact_at_its_edge(task: Task) -> None:
    history = chat_history(1)
    assert history[3]["role"] == "tool"
    size = task.harness.counter.count(history[3]["content"])
    assert size > 500
    stays = compact_history(task, history, keep_last=0, min_tokens=size + 1)
    assert stays[3] == history[3]
    moved = compact_history(task, history, keep_last=0, min_tokens=size)
    assert parse_notice(moved[3]["content"]) is not None


def test_a_json_result_is_stored_byte_for_byte(task: Task) -> None:
    payload = json.dumps([{"id": i, "note": "x" * 50} for i in range(100)], indent=1)
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "j", "function": {"name": "q"}}],
        },
        {"role": "tool", "tool_call_id": "j", "content": payload},
    ]
    [_, moved] = compact_history(task, messages, keep_last=0)
    fields = parse_notice(moved["content"])
    assert fields is not None
    assert task.read(fields["path"]) == payload.encode()
    output = Toolset(task).call("read_artifact", {"path": fields["path"]})
    assert json.loads(output.text)["items"] == json.loads(payload)


def test_anthropic_history(task: Task) -> None:
    toolset = Toolset(task)
    task.register_tools(toolset.names)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing step."}]
    for i in range(5):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Checking {i}."},
                    {"type": "tool_use", "id": f"tu_{i}", "name": "logs", "input": {"step": i}},
                ],
            }
        )
        content: Any = result_text(i)
        if i == 1:  # text in two blocks around a screenshot
            content = [
                {"type": "text", "text": content[:500]},
                IMAGE,
                {"type": "text", "text": content[500:]},
            ]
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"tu_{i}", "content": content}],
            }
        )
    out = compact_history(task, messages, keep_last=2)
    assert out[0] == messages[0] and len(out) == len(messages)
    for i in range(5):
        assistant, user = out[1 + 2 * i], out[2 + 2 * i]
        assert assistant == messages[1 + 2 * i]
        [block] = user["content"]
        original = messages[2 + 2 * i]["content"][0]
        if i >= 3:
            assert block == original
            continue
        assert block["tool_use_id"] == f"tu_{i}"
        if i == 1:
            # The image is not text to move: it stays, after the notice.
            notice_text = block["content"][0]["text"]
            assert block["content"][1:] == [IMAGE]
        else:
            notice_text = block["content"]
        fields = parse_notice(notice_text)
        assert fields is not None and fields["tool"] == "logs"
        assert read_back(toolset, fields["path"]) == result_text(i)


def test_responses_history(task: Task) -> None:
    toolset = Toolset(task)
    task.register_tools(toolset.names)
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "go"}]
    for i in range(4):
        items.append({"type": "function_call", "call_id": f"fc_{i}", "name": "logs"})
        items.append(
            {"type": "function_call_output", "call_id": f"fc_{i}", "output": result_text(i)}
        )
    out = compact_history(task, items, keep_last=1)
    for new, old in zip(out, items, strict=True):
        if old.get("type") != "function_call_output" or old["call_id"] == "fc_3":
            assert new == old
            continue
        fields = parse_notice(new["output"])
        assert fields is not None
        assert (fields["tool"], fields["call_id"]) == ("logs", old["call_id"])
        assert read_back(toolset, fields["path"]) == old["output"]
