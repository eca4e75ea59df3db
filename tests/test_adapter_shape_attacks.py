"""Content in a shape the adapters do not know (a part given bare, a list of strings, nested
lists, None, a number) passes the gate like any other: before, every element that was not a
part was left out of what the gate counted, so a secret in it reached the model under a
redacting policy, a large one was never offloaded, and None or a number crashed the step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spillbox import Harness, Retention, Task, gate_anthropic, gate_chat_completions, gate_responses

SECRET = "AKIAIOSFODNN7REALKEY"
ODD_SHAPES: list[Any] = [
    {"type": "input_text", "text": f"key {SECRET}"},
    [f"key {SECRET}"],
    [["nested", {"deep": SECRET}]],
    [{"type": "input_text", "text": "see"}, f"key {SECRET}"],
]


@pytest.fixture
def task(tmp_path: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=tmp_path / "home", environ={}, gc_interval=-1) as harness:
        with harness.task("odd", retention=Retention(redact=True)) as task:
            yield task


@pytest.mark.parametrize("content", ODD_SHAPES, ids=["bare-part", "strings", "nested", "mixed"])
def test_a_secret_in_an_unknown_shape_never_reaches_the_model(task: Task, content: Any) -> None:
    shown = [
        gate_responses(task, [{"type": "function_call_output", "call_id": "c", "output": content}]),
        gate_chat_completions(task, [{"role": "tool", "tool_call_id": "c", "content": content}]),
        gate_anthropic(task, [{"type": "tool_result", "tool_use_id": "c", "content": content}]),
    ]
    for gated in shown:
        assert SECRET not in json.dumps(gated) and "[REDACTED:" in json.dumps(gated)


def test_strings_in_a_list_are_text_and_reach_the_model_redacted(task: Task) -> None:
    """A string among a content list's parts is text (as LangChain's content lists have it):
    the list's text is counted joined, and reaches the model redacted, as that text."""
    [item] = gate_responses(
        task, [{"type": "function_call_output", "call_id": "c", "output": ["a ", f"key {SECRET}"]}]
    )
    assert item["output"] == "a key [REDACTED:aws_access_token]"


@pytest.mark.parametrize("content", [None, 42, True], ids=["none", "number", "bool"])
def test_a_value_that_is_not_content_passes_as_it_is(task: Task, content: Any) -> None:
    [item] = gate_responses(
        task, [{"type": "function_call_output", "call_id": "c", "output": content}]
    )
    assert item["output"] is content


def test_a_large_list_of_strings_is_offloaded_byte_for_byte(task: Task) -> None:
    rows = [json.dumps({"id": i, "body": "lorem ipsum " * 40}) for i in range(300)]
    [item] = gate_responses(
        task, [{"type": "function_call_output", "call_id": "c", "output": rows}]
    )
    assert isinstance(item["output"], str) and item["output"].startswith("[spillbox offloaded")
    assert task.read("c") == "".join(rows).encode()  # the list's text, as counted
