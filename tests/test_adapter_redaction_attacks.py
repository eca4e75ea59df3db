"""Attacks on redaction through the provider adapters (issue 21, item 1): under a redacting
policy a small tool result that the gate leaves inline must reach the model redacted, in
each API's shape, and the access log must count exactly what was replaced in what the
adapter gave back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redaction_corpus import aws_id, github_pat, slack_bot
from spillbox import Harness, Retention, Task, ToolResult
from spillbox.adapters import gate_anthropic, gate_chat_completions, gate_responses
from spillbox.tools import Toolset
from test_adapters import (
    IMAGE,
    PNG_URL,
    SDK_MESSAGE_TYPES,
    assert_valid_messages,
    notice,
)

SECRETS = (github_pat, aws_id, slack_bot)
MARK = "[REDACTED:"


@pytest.fixture
def harness(home: Path) -> Iterator[Harness]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        yield harness


@pytest.fixture
def task(harness: Harness) -> Iterator[Task]:
    with harness.task("redacting", retention=Retention(redact=True)) as task:
        yield task


def replaced_in_log(task: Task) -> dict[str, int]:
    """The access log's inline `redact` entries: replacements by call id."""
    entries = [e for e in task.harness.catalog.audit(task.id) if e.action == "redact"]
    return {json.loads(e.detail)["call_id"]: json.loads(e.detail)["replaced"] for e in entries}


def marks(value: Any) -> int:
    return json.dumps(value).count(MARK)


def leaked(value: Any) -> list[str]:
    dumped = json.dumps(value)
    return [secret for secret in SECRETS if secret in dumped]


def test_a_small_chat_completions_tool_message_is_redacted(task: Task) -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "whoami", "arguments": "{}"}}]
    history = [
        {"role": "user", "content": "Who am I?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    content = f"logged in with {github_pat}; key {aws_id}"
    messages = [{"role": "tool", "tool_call_id": "c1", "content": content}]
    [out] = gate_chat_completions(task, messages, calls)
    assert leaked(out) == [], out
    assert out["content"] == "logged in with [REDACTED:github_pat]; key [REDACTED:aws_access_token]"
    assert replaced_in_log(task) == {"c1": 2} and marks(out) == 2
    assert_valid_messages([*history, out], "chat")
    assert messages[0]["content"] == content  # the caller's message is not changed in place


def test_a_small_responses_output_with_an_image_is_redacted_and_keeps_its_image(
    task: Task,
) -> None:
    image = {"type": "input_image", "image_url": PNG_URL, "detail": "auto"}
    output = [
        {"type": "input_text", "text": f"token={github_pat}\n"},
        image,
        {"type": "input_text", "text": "done"},
    ]
    items = [
        {"type": "function_call", "call_id": "f1", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "f1", "output": output},
    ]
    call, out = gate_responses(task, items)
    assert leaked(out) == [] and marks(out) == 1 == replaced_in_log(task)["f1"]
    # One text part where the first was (the gate counted them joined), the image in place.
    assert out["output"] == [
        {"type": "input_text", "text": "token=[REDACTED:github_pat]\ndone"},
        image,
    ]
    assert_valid_messages([{"role": "user", "content": "go"}, call, out], "responses")


def test_a_secret_split_across_two_text_parts_is_not_put_back_together(task: Task) -> None:
    """The gate reads a result's text parts joined, so a token cut in two is found; the
    model, which reads them joined as well, must not get the halves back."""
    half = len(github_pat) // 2
    blocks = [
        {
            "type": "tool_result",
            "tool_use_id": "t1",
            "content": [
                {"type": "text", "text": f"pat {github_pat[:half]}"},
                {"type": "text", "text": f"{github_pat[half:]} end"},
                IMAGE,
            ],
        }
    ]
    [out] = gate_anthropic(task, blocks)
    joined = "".join(part.get("text", "") for part in out["content"])
    assert github_pat[:half] not in joined and github_pat[half:] not in joined
    assert out["content"] == [{"type": "text", "text": "pat [REDACTED:github_pat] end"}, IMAGE]
    assert replaced_in_log(task) == {"t1": 1}
    message = {"role": "user", "content": [out]}
    assert_valid_messages([message], "anthropic")


def test_anthropic_one_step_of_several_results_redacts_each_and_logs_each(task: Task) -> None:
    assistant = [{"type": "tool_use", "id": f"u{i}", "name": "env", "input": {}} for i in range(3)]
    message = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "u0", "content": f"SLACK={slack_bot}"},
            {"type": "tool_result", "tool_use_id": "u1", "content": "nothing to hide"},
            {
                "type": "tool_result",
                "tool_use_id": "u2",
                "content": json.dumps({"password": "hunter2!", "user": "ann"}),
                "is_error": True,
            },
        ],
    }
    out = gate_anthropic(task, message, assistant)
    first, clean, error = out["content"]
    assert leaked(out) == [] and "hunter2!" not in json.dumps(out)
    assert clean == message["content"][1]  # nothing replaced: not rewritten
    assert error["is_error"] is True
    assert json.loads(error["content"]) == {"password": "[REDACTED:password]", "user": "ann"}
    assert replaced_in_log(task) == {"u0": 1, "u2": 1}
    assert marks(out) == sum(replaced_in_log(task).values())
    assert_valid_messages([{"role": "assistant", "content": assistant}, out], "anthropic")


def test_a_page_of_a_payload_stored_before_the_task_redacted_reaches_the_model_redacted(
    harness: Harness,
) -> None:
    """read_artifact pages what was stored: a payload stored while the task did not redact
    holds its secrets, and a page of it passes the adapters like any result."""
    payload = json.dumps([{"id": i, "token": github_pat, "pad": "x" * 400} for i in range(200)])
    with harness.task("later") as plain:
        [stored] = plain.admit([ToolResult("c1", "dump", payload)])
    assert stored.artifact is not None
    with harness.task("later", retention=Retention(redact=True)) as task:
        toolset = Toolset(task)
        page = toolset.call("read_artifact", {"artifact_id": stored.artifact.id})
        assert github_pat in page.text  # the stored bytes are as they were stored
        messages = [{"role": "tool", "tool_call_id": "r1", "content": page.text}]
        calls = [
            {"id": "r1", "type": "function", "function": {"name": "read_artifact", "arguments": ""}}
        ]
        [out] = gate_chat_completions(task, messages, calls)
    assert leaked(out) == []
    assert json.loads(out["content"])["items"][0]["token"] == "[REDACTED:github_pat]"
    assert marks(out) == replaced_in_log(task)["r1"] > 0


@pytest.mark.parametrize("shape", list(SDK_MESSAGE_TYPES))
def test_without_redaction_a_small_result_is_given_back_as_it_was(
    harness: Harness, shape: str
) -> None:
    with harness.task("plain") as task:
        content = [{"type": "text", "text": f"pat {github_pat}"}, {"type": "text", "text": "b"}]
        if shape == "chat":
            [out] = gate_chat_completions(
                task, [{"role": "tool", "tool_call_id": "c", "content": content}]
            )
        elif shape == "responses":
            parts = [{"type": "input_text", "text": p["text"]} for p in content]
            [out] = gate_responses(
                task, [{"type": "function_call_output", "call_id": "c", "output": parts}]
            )
            content = parts
        else:
            [out] = gate_anthropic(
                task, [{"type": "tool_result", "tool_use_id": "c", "content": content}]
            )
    assert out.get("content", out.get("output")) == content
    assert replaced_in_log(task) == {}


def document(text: str) -> dict[str, Any]:
    """An Anthropic document block of plain text, as a tool_result's content may hold."""
    return {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": text},
        "title": "notes.txt",
    }


def test_a_document_in_a_tool_result_is_redacted(task: Task) -> None:
    """A tool_result's document block is read by the model as its text is: it is redacted
    too, and stays a document."""
    blocks = [
        {
            "type": "tool_result",
            "tool_use_id": "d1",
            "content": [
                {"type": "text", "text": "the notes:"},
                document(f"deploy with {github_pat}\n"),
                IMAGE,
            ],
        }
    ]
    [out] = gate_anthropic(task, blocks)
    assert leaked(out) == []
    text, doc, image = out["content"]
    assert text == {"type": "text", "text": "the notes:"}
    assert doc["type"] == "document" and doc["title"] == "notes.txt"
    assert doc["source"]["data"].startswith("deploy with [REDACTED:github_pat]")
    assert image == IMAGE
    assert marks(out) == replaced_in_log(task)["d1"] == 1
    assert_valid_messages([{"role": "user", "content": [out]}], "anthropic")


def test_a_large_document_behind_a_short_text_is_offloaded(task: Task) -> None:
    body = "0123456789abcdef\n" * 100_000  # 1.7 MB
    blocks = [
        {
            "type": "tool_result",
            "tool_use_id": "d2",
            "content": [{"type": "text", "text": "see the report"}, document(body), IMAGE],
        }
    ]
    [out] = gate_anthropic(task, blocks)
    assert len(json.dumps(out)) < 10_000  # the document did not reach the model
    fields = notice(out["content"])
    assert fields["reason"].startswith("per_call")
    assert out["content"][1:] == [IMAGE]
    stored = json.loads(task.read(fields["path"]))
    assert stored["text"] == "see the report" and stored["parts"] == [document(body)]
    assert_valid_messages([{"role": "user", "content": [out]}], "anthropic")
