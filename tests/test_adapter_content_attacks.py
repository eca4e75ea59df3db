"""Attacks on what the adapters count of a content list: a plain string among its parts (as
LangChain's content lists hold them) was dropped from what the gate counted, so a large
result or a secret in one passed to the model uncounted and unredacted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from redaction_corpus import aws_id
from spillbox import Harness, Retention, Task, ToolResult
from spillbox.adapters import counted_content, gate_chat_completions, gated_content
from test_adapters import notice

LARGE = "lorem ipsum dolor sit amet " * 2_000
"""About 12,000 tokens: over the per-call limit."""


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("content", retention=Retention(redact=True)) as task:
            yield task


def test_a_large_plain_string_part_is_offloaded(task: Task) -> None:
    content = ["a header", {"type": "text", "text": "then"}, LARGE]
    assert counted_content(content) == "a headerthen" + LARGE
    [message] = gate_chat_completions(
        task, [{"role": "tool", "tool_call_id": "c1", "content": content}]
    )
    notice(message["content"])
    assert task.read(task.artifact("c1")) == ("a headerthen" + LARGE).encode()


def test_a_secret_in_a_plain_string_part_is_redacted(task: Task) -> None:
    secret = aws_id
    content = [f"key {secret}", {"type": "image_url", "image_url": {"url": "data:,"}}]
    result = ToolResult("c2", "t", counted_content(content))
    [item] = task.admit([result])
    gated = gated_content(content, result, item)
    assert secret not in str(gated)
    assert {"type": "image_url", "image_url": {"url": "data:,"}} in gated
