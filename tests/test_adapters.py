"""The provider adapters: one step's tool results in each API's shape, gated as one aggregate,
and still valid messages of the provider SDKs' own types."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import MessageParam as AnthropicMessageParam
from openai.types.chat import ChatCompletionMessageParam
from openai.types.responses import ResponseInputItemParam

from spillbox import Harness, Task, ToolResult, parse_notice
from spillbox.adapters import (
    add_tools,
    compact_history,
    gate_anthropic,
    gate_chat_completions,
    gate_responses,
)
from spillbox.tokens import default_counter
from spillbox.tools import Toolset
from test_tools import SDK_TOOL_TYPES, assert_sdk_shape

COUNTER = default_counter("cl100k_base")
WORDS = "alpha beta gamma delta merge branch release fix parser docs test build".split()
IMAGE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
}


def text_of_tokens(tokens: int, seed: int) -> str:
    """Text of about this many tokens (within 2 %)."""
    rng = random.Random(seed)
    text = " ".join(rng.choices(WORDS, k=tokens))
    while COUNTER.count(text) > tokens:
        text = text.rsplit(" ", 1)[0]
    assert COUNTER.count(text) >= 0.98 * tokens
    return text


BIG = json.dumps([{"id": i, "body": "lorem ipsum " * 60} for i in range(200)])
SMALL = '{"ok": true}'


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("step") as task:
            yield task


def notice(text: Any) -> dict[str, str]:
    fields = parse_notice(text if isinstance(text, str) else text[0]["text"])
    assert fields is not None, text
    return fields


def stored(task: Task, fields: dict[str, str]) -> bytes:
    return task.read(fields["path"])


# OpenAI Chat Completions


def test_chat_completions_step(task: Task) -> None:
    tool_calls = [
        {"id": "call_1", "type": "function", "function": {"name": "list_prs", "arguments": "{}"}},
        {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "{}"}},
    ]
    messages = [
        {"role": "tool", "tool_call_id": "call_1", "content": BIG},
        {"role": "tool", "tool_call_id": "call_2", "content": SMALL},
    ]
    before = copy.deepcopy(messages)
    out = gate_chat_completions(task, messages, tool_calls)
    assert messages == before  # the caller's list is not touched
    assert [(m["role"], m["tool_call_id"]) for m in out] == [("tool", "call_1"), ("tool", "call_2")]
    fields = notice(out[0]["content"])
    assert fields["tool"] == "list_prs" and fields["call_id"] == "call_1"
    assert fields["reason"].startswith("per_call")
    assert stored(task, fields) == BIG.encode()
    assert out[1] == messages[1]  # small: untouched


def test_chat_completions_content_parts_stay_as_they_were_when_small(task: Task) -> None:
    parts = [{"type": "text", "text": "first part. "}, {"type": "text", "text": "second part."}]
    big_parts = [{"type": "text", "text": BIG[:20_000]}, {"type": "text", "text": BIG[20_000:]}]
    out = gate_chat_completions(
        task,
        [
            {"role": "tool", "tool_call_id": "a", "content": parts},
            {"role": "tool", "tool_call_id": "b", "content": big_parts},
        ],
    )
    assert out[0]["content"] == parts
    fields = notice(out[1]["content"])
    assert fields["tool"] == "tool"  # no tool_calls given: a neutral name, not a crash
    assert stored(task, fields) == BIG.encode()  # the text parts, in order


# OpenAI Responses


def test_responses_step(task: Task) -> None:
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "function_call", "call_id": "fc_1", "name": "list_prs", "arguments": "{}"},
        {"type": "function_call", "call_id": "fc_2", "name": "ping", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "fc_1", "output": BIG},
        {"type": "function_call_output", "call_id": "fc_2", "output": SMALL},
    ]
    before = copy.deepcopy(items)
    out = gate_responses(task, items)
    assert items == before
    assert [i["type"] for i in out] == [i["type"] for i in items]
    assert out[:3] == items[:3] and out[4] == items[4]
    fields = notice(out[3]["output"])
    assert (fields["tool"], fields["call_id"]) == ("list_prs", "fc_1")
    assert out[3]["call_id"] == "fc_1"
    assert stored(task, fields) == BIG.encode()


# Anthropic Messages


def test_anthropic_step(task: Task) -> None:
    assistant = [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "tu_1", "name": "list_prs", "input": {}},
        {"type": "tool_use", "id": "tu_2", "name": "screenshot", "input": {}},
        {"type": "tool_use", "id": "tu_3", "name": "ping", "input": {}},
        {"type": "tool_use", "id": "tu_4", "name": "notes", "input": {}},
    ]
    blocks = [
        {"type": "tool_result", "tool_use_id": "tu_1", "content": BIG},
        {
            "type": "tool_result",
            "tool_use_id": "tu_2",
            "content": [
                {"type": "text", "text": BIG[:30_000]},
                IMAGE,
                {"type": "text", "text": BIG[30_000:]},
            ],
        },
        {"type": "tool_result", "tool_use_id": "tu_3", "content": "boom", "is_error": True},
        {
            "type": "tool_result",
            "tool_use_id": "tu_4",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, IMAGE],
        },
        {"type": "text", "text": "Here are the results."},
    ]
    message = {"role": "user", "content": blocks}
    before = copy.deepcopy(message)
    out = gate_anthropic(task, message, assistant)
    assert message == before
    assert out["role"] == "user" and len(out["content"]) == len(blocks)
    big, with_image, error, small, text = out["content"]
    fields = notice(big["content"])
    assert (fields["tool"], fields["call_id"]) == ("list_prs", "tu_1")
    assert stored(task, fields) == BIG.encode()
    # The image stays, after the notice that replaces the text parts.
    assert with_image["content"][1:] == [IMAGE]
    fields = notice(with_image["content"])
    assert fields["tool"] == "screenshot"
    assert stored(task, fields) == BIG.encode()
    assert error == blocks[2] and error["is_error"] is True
    assert small == blocks[3]  # small: untouched, parts and order as they were
    assert text == blocks[4]


def test_anthropic_accepts_a_list_of_blocks(task: Task) -> None:
    blocks = [
        {"type": "tool_result", "tool_use_id": "x", "content": BIG},
        {"type": "tool_result", "tool_use_id": "y", "content": SMALL},
    ]
    out = gate_anthropic(task, blocks)
    assert isinstance(out, list) and len(out) == 2
    assert notice(out[0]["content"])["call_id"] == "x"
    assert out[1] == blocks[1]


def test_a_big_error_result_is_offloaded_and_keeps_is_error(task: Task) -> None:
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 20_000 + "ValueError: bad\n"
    out = gate_anthropic(
        task, [{"type": "tool_result", "tool_use_id": "e", "content": trace, "is_error": True}]
    )
    assert out[0]["is_error"] is True
    fields = notice(out[0]["content"])
    assert "ValueError: bad" in fields["tail"]  # the tail, where the error is, is shown


# One step, one aggregate: three results of 4,000 tokens each


def step_in(shape: str, contents: list[str]) -> Any:
    ids = [f"c{i}" for i in range(len(contents))]
    if shape == "chat":
        return [
            {"role": "tool", "tool_call_id": i, "content": c}
            for i, c in zip(ids, contents, strict=True)
        ]
    if shape == "responses":
        return [
            {"type": "function_call_output", "call_id": i, "output": c}
            for i, c in zip(ids, contents, strict=True)
        ]
    return {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": i, "content": c}
            for i, c in zip(ids, contents, strict=True)
        ],
    }


def gate_step(task: Task, shape: str, step: Any) -> list[str]:
    """The gated contents of a step, in call order."""
    if shape == "chat":
        return [m["content"] for m in gate_chat_completions(task, step)]
    if shape == "responses":
        return [i["output"] for i in gate_responses(task, step)]
    return [b["content"] for b in gate_anthropic(task, step)["content"]]


@pytest.mark.parametrize("shape", ["chat", "responses", "anthropic"])
def test_parallel_results_count_as_one_aggregate(task: Task, shape: str) -> None:
    contents = [text_of_tokens(4_000, seed) for seed in range(3)]
    out = gate_step(task, shape, step_in(shape, contents))
    reasons = [notice(text)["reason"].split()[0] if parse_notice(text) else None for text in out]
    # Each alone is under the 6,000 per-call threshold; together they are over 10,000.
    assert "per_call" not in reasons
    assert reasons.count("aggregate") >= 1
    assert sum(COUNTER.count(text) for text in out) <= 10_000
    for text, original in zip(out, contents, strict=True):
        if parse_notice(text):
            assert stored(task, notice(text)) == original.encode()
        else:
            assert text == original
    # Deterministic: the same step again gives the same decisions.
    again = gate_step(task, shape, step_in(shape, contents))
    assert [parse_notice(t) is None for t in again] == [parse_notice(t) is None for t in out]


@pytest.mark.parametrize("shape", ["chat", "responses", "anthropic"])
def test_pages_of_read_artifact_are_withheld_not_offloaded(task: Task, shape: str) -> None:
    # Three pages read back in one step: over the aggregate, but offloading a page would
    # loop, so the largest are withheld (the call is repeated later) and none is stored.
    toolset = Toolset(task)
    [admitted] = task.admit([ToolResult("big", "t", BIG * 3)])
    assert admitted.offloaded
    calls: list[dict[str, Any]] = [{"artifact_id": "big"}]
    for _ in range(2):
        page = json.loads(toolset.call("read_artifact", calls[-1]).text)
        calls.append({"artifact_id": "big", "cursor": page["next_cursor"]})
    pages = [toolset.call("read_artifact", args).text for args in calls]
    ids = [f"c{i}" for i in range(3)]  # as step_in names them
    step = step_in(shape, pages)
    before = len(task.artifacts())
    if shape == "chat":
        tool_calls = [{"id": i, "function": {"name": "read_artifact"}} for i in ids]
        out = [m["content"] for m in gate_chat_completions(task, step, tool_calls)]
    elif shape == "responses":
        calls_items = [
            {"type": "function_call", "call_id": i, "name": "read_artifact"} for i in ids
        ]
        gated = gate_responses(task, [*calls_items, *step])
        out = [i["output"] for i in gated if i["type"] == "function_call_output"]
    else:
        uses = [{"type": "tool_use", "id": i, "name": "read_artifact"} for i in ids]
        out = [b["content"] for b in gate_anthropic(task, step, uses)["content"]]
    assert len(task.artifacts()) == before  # no page became an artifact
    withheld = [text for text in out if text.startswith("[spillbox] result withheld")]
    assert withheld and all(text in pages or text in withheld for text in out)
    assert sum(COUNTER.count(text) for text in out) <= 10_000


def test_two_steps_are_two_aggregates(task: Task) -> None:
    one = text_of_tokens(4_000, 1)
    two = text_of_tokens(4_000, 2)
    for content in (one, two):  # each step alone is under every threshold
        [message] = gate_chat_completions(
            task, [{"role": "tool", "tool_call_id": "s", "content": content}]
        )
        assert message["content"] == content


# add_tools


def test_add_tools_adds_ours_once_and_keeps_the_users(task: Task) -> None:
    toolset = Toolset(task)
    user = {
        "type": "function",
        "function": {"name": "list_prs", "description": "PRs", "parameters": {"type": "object"}},
    }
    stale = {"type": "function", "function": {"name": "read_artifact", "parameters": {}}}
    tools = add_tools([user, stale], toolset, "openai")
    assert tools[0] == user
    names = [t["function"]["name"] for t in tools]
    assert names == ["list_prs", "read_artifact", "list_artifacts", "search_artifacts"]
    assert tools[1:] == toolset.definitions("openai")  # ours, not the stale copy
    assert add_tools(tools, toolset, "openai") == tools  # idempotent

    anthropic_user = {"name": "search", "description": "CRM", "input_schema": {"type": "object"}}
    tools = add_tools(add_tools([anthropic_user], toolset, "anthropic"), toolset, "anthropic")
    assert [t["name"] for t in tools] == [
        "search",
        "read_artifact",
        "list_artifacts",
        "search_artifacts",
    ]
    assert add_tools([], toolset, "responses") == toolset.definitions("responses")


@pytest.mark.parametrize("fmt", ["openai", "responses", "anthropic"])
def test_add_tools_gives_a_list_of_valid_sdk_tools(task: Task, fmt: str) -> None:
    user = {
        "openai": {"type": "function", "function": {"name": "list_prs", "parameters": {}}},
        "responses": {"type": "function", "name": "list_prs", "parameters": {}, "strict": False},
        "anthropic": {"name": "list_prs", "input_schema": {"type": "object"}},
    }[fmt]
    for tool in add_tools([user], Toolset(task), fmt):  # type: ignore[arg-type]
        assert_sdk_shape(tool, SDK_TOOL_TYPES[fmt])


# The provider SDKs' own message types: what the adapters give back is still a valid message


SDK_MESSAGE_TYPES: dict[str, Any] = {
    "chat": ChatCompletionMessageParam,
    "responses": ResponseInputItemParam,
    "anthropic": AnthropicMessageParam,
}
PNG_URL = "data:image/png;base64,iVBORw0KGgo="


def chat_step() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A Chat Completions step as a loop holds it: the history, then the tool messages."""
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for i, name in enumerate(["list_prs", "get_logs", "ping"])
    ]
    history = [
        {"role": "system", "content": "You review pull requests."},
        {"role": "user", "content": [{"type": "text", "text": "Who merged most?"}]},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    halves = [{"type": "text", "text": BIG[:20_000]}, {"type": "text", "text": BIG[20_000:]}]
    results = [
        {"role": "tool", "tool_call_id": "call_0", "content": BIG},
        {"role": "tool", "tool_call_id": "call_1", "content": halves},
        {"role": "tool", "tool_call_id": "call_2", "content": SMALL},
    ]
    return history, results


def responses_step() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A Responses step: the input items so far, then the function_call_output items."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "Who merged most?"}]
    history += [
        {"type": "function_call", "call_id": f"fc_{i}", "name": name, "arguments": "{}"}
        for i, name in enumerate(["list_prs", "screenshot", "ping"])
    ]
    with_image = [
        {"type": "input_text", "text": BIG[:30_000]},
        {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
        {"type": "input_text", "text": BIG[30_000:]},
    ]
    results = [
        {"type": "function_call_output", "call_id": "fc_0", "output": BIG},
        {"type": "function_call_output", "call_id": "fc_1", "output": with_image},
        {"type": "function_call_output", "call_id": "fc_2", "output": SMALL},
    ]
    return history, results


def anthropic_step() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An Anthropic step: the messages so far, then the user message of tool_result blocks."""
    uses = [
        {"type": "tool_use", "id": f"tu_{i}", "name": name, "input": {"state": "all"}}
        for i, name in enumerate(["list_prs", "screenshot", "ping"])
    ]
    history = [
        {"role": "user", "content": "Who merged most?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, *uses]},
    ]
    blocks = [
        {"type": "tool_result", "tool_use_id": "tu_0", "content": BIG},
        {
            "type": "tool_result",
            "tool_use_id": "tu_1",
            "content": [
                {"type": "text", "text": BIG[:30_000]},
                IMAGE,
                {"type": "text", "text": BIG[30_000:]},
            ],
        },
        {"type": "tool_result", "tool_use_id": "tu_2", "content": "boom", "is_error": True},
        {"type": "text", "text": "Here are the results."},
    ]
    return history, [{"role": "user", "content": blocks}]


STEPS = {"chat": chat_step, "responses": responses_step, "anthropic": anthropic_step}
ANSWERS: dict[str, dict[str, Any]] = {
    "chat": {"role": "assistant", "content": "Alice merged most."},
    "responses": {"role": "assistant", "content": "Alice merged most."},
    "anthropic": {"role": "assistant", "content": [{"type": "text", "text": "Alice merged most."}]},
}


def assert_valid_messages(messages: list[dict[str, Any]], shape: str) -> None:
    for message in messages:
        assert_sdk_shape(message, SDK_MESSAGE_TYPES[shape])


def notices_in(value: Any) -> int:
    """How many notices stand in the messages, at any depth."""
    if isinstance(value, str):
        return int(parse_notice(value) is not None)
    if isinstance(value, dict):
        value = list(value.values())
    return sum(notices_in(item) for item in value) if isinstance(value, list) else 0


def images_in(value: Any) -> int:
    if isinstance(value, dict):
        own = int(value.get("type") in ("image", "input_image"))
        return own + sum(images_in(item) for item in value.values())
    return sum(images_in(item) for item in value) if isinstance(value, list) else 0


@pytest.mark.parametrize("shape", list(STEPS))
def test_gated_messages_are_valid_sdk_messages(task: Task, shape: str) -> None:
    history, results = STEPS[shape]()
    assert_valid_messages([*history, *results], shape)  # the input is real, to begin with
    if shape == "chat":
        gated = gate_chat_completions(task, results, history[-1]["tool_calls"])
    elif shape == "responses":
        gated = gate_responses(task, [*history, *results])[len(history) :]
    else:
        gated = [gate_anthropic(task, results[0], history[-1]["content"])]
    assert_valid_messages([*history, *gated], shape)
    # The big results became notices; the image stayed beside its notice.
    assert notices_in(gated) == 2 and notices_in(results) == 0
    assert images_in(gated) == images_in(results)


def test_anthropic_blocks_gated_as_a_list_make_a_valid_user_message(task: Task) -> None:
    history, [message] = anthropic_step()
    blocks = gate_anthropic(task, message["content"], history[-1]["content"])
    assert notices_in(blocks) == 2
    assert_sdk_shape({"role": "user", "content": blocks}, AnthropicMessageParam)


@pytest.mark.parametrize("shape", list(STEPS))
def test_compacted_history_is_valid_sdk_messages(task: Task, shape: str) -> None:
    history, results = STEPS[shape]()
    _, later = STEPS[shape]()  # a second step whose results are the last ones: kept
    conversation = [*history, *results, *later, ANSWERS[shape]]
    assert_valid_messages(conversation, shape)
    out = compact_history(task, conversation, keep_last=3, min_tokens=100)
    assert_valid_messages(out, shape)
    assert notices_in(out) == 2 and notices_in(conversation) == 0
    assert images_in(out) == images_in(conversation)
