"""Adapters for the message shapes of the provider APIs, and reversible history compaction.

Give one step's tool results in the shape your loop already uses; get them back in the
same shape, gated as one aggregate (parallel calls of one step count together):

    messages += gate_chat_completions(task, tool_messages, assistant["tool_calls"])
    input_items = gate_responses(task, input_items)
    user_message = gate_anthropic(task, user_message, assistant["content"])
    request["tools"] = add_tools(request.get("tools", []), toolset, "anthropic")

A tool's images (ToolOutput.images: what a script left in /sandbox/outputs) go after its
text, in the shape each API takes:

    block["content"] = tool_content(admitted.text, output.images, "anthropic")
    item["output"] = tool_content(admitted.text, output.images, "responses")
    messages.append(chat_images_message([(call_id, output.images)]))   # after the step's tools

compact_history moves older tool results out of a long conversation into the task's
sandbox and leaves notices in their place; read_artifact opens them again.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from spillbox.notice import parse_notice
from spillbox.tokens import count_within
from spillbox.tools import READ_ARTIFACT, Format, Toolset
from spillbox.types import ToolResult

if TYPE_CHECKING:
    from spillbox.protocols import TaskHandle
    from spillbox.types import Admitted, Image

DEFAULT_TOOL_NAME = "tool"


def add_tools(tools: Sequence[Mapping[str, Any]], toolset: Toolset, fmt: Format) -> list[Any]:
    """A request's tool list with spillbox's tools added (once) in the provider's shape."""
    ours = toolset.definitions(fmt)
    names = {_tool_name(tool) for tool in ours}
    return [dict(t) for t in tools if _tool_name(t) not in names] + ours


def _tool_name(tool: Mapping[str, Any]) -> str:
    function = tool.get("function")
    return str(function["name"] if isinstance(function, Mapping) else tool.get("name", ""))


def _gate_slots(
    task: TaskHandle,
    slots: Sequence[tuple[dict[str, Any], str, str, bool]],
    names: Mapping[str, str],
) -> None:
    """Gate one step's results in place: each slot is (holder, key, call id, is_error).

    What is gated of a result is its text and every part besides images (counted_content);
    gated_content says what the gate's decision leaves of it.
    Pages of spillbox's own read_artifact are never offloaded again (that would loop).
    """
    results = []
    for holder, key, call_id, is_error in slots:
        tool = names.get(call_id, DEFAULT_TOOL_NAME)
        content = counted_content(holder.get(key, ""))
        results.append(ToolResult(call_id, tool, content, is_error, tool != READ_ARTIFACT))
    admitted = task.admit(results)
    for (holder, key, _, _), result, item in zip(slots, results, admitted, strict=True):
        if key in holder or item.reason is not None:
            holder[key] = gated_content(holder.get(key, ""), result, item)


def gated_content(content: Any, result: ToolResult, item: Admitted) -> Any:
    """A content field (a string, or a list of parts) as the gate's decision on it leaves
    it: content itself, the very object, where the gate left it inline and unchanged; an
    offloaded, withheld or refused one's notice in place of what was counted, its images
    where they were; one left inline but redacted (a redacting policy) with the parts the
    gate redacted, which is what the access log's `redact` entry counts.
    result: what the gate was given of content (counted_content(content))."""
    if item.reason is not None:
        return _with_text(content, item.text)
    if item.text != result.content:
        return _with_redacted(content, item.text)
    return content


# OpenAI Chat Completions: {"role": "tool", "tool_call_id": ..., "content": str | [parts]}


def gate_chat_completions(
    task: TaskHandle,
    tool_messages: Sequence[Mapping[str, Any]],
    tool_calls: Sequence[Mapping[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Gate one step's tool messages; tool_calls (the assistant's) supply tool names."""
    names = {
        str(c["id"]): c.get("function", {}).get("name", DEFAULT_TOOL_NAME) for c in tool_calls or ()
    }
    messages = [dict(m) for m in tool_messages]
    _gate_slots(task, [(m, "content", str(m["tool_call_id"]), False) for m in messages], names)
    return messages


# OpenAI Responses: {"type": "function_call_output", "call_id": ..., "output": str}


def gate_responses(task: TaskHandle, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Gate the function_call_output items of one step; other items pass unchanged."""
    out = [dict(item) for item in items]
    names = {
        str(i["call_id"]): i.get("name", DEFAULT_TOOL_NAME)
        for i in out
        if i.get("type") == "function_call"
    }
    outputs = [i for i in out if i.get("type") == "function_call_output"]
    _gate_slots(task, [(i, "output", str(i["call_id"]), False) for i in outputs], names)
    return out


# Anthropic Messages: a user message whose content has {"type": "tool_result", ...} blocks


def gate_anthropic(
    task: TaskHandle,
    message: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    assistant_content: Sequence[Mapping[str, Any]] | None = None,
) -> Any:
    """Gate the tool_result blocks of one step (a user message, or its list of blocks).

    Images in a result stay as they are; its text and its other parts (documents, search
    results) are gated.
    """
    names = {
        str(b["id"]): b.get("name", DEFAULT_TOOL_NAME)
        for b in assistant_content or ()
        if b.get("type") == "tool_use"
    }
    if isinstance(message, Mapping):
        out_message: dict[str, Any] = dict(message)
        blocks = [dict(b) for b in message.get("content", [])]
        out_message["content"] = blocks
    else:
        blocks = [dict(b) for b in message]
    slots = [
        (b, "content", str(b["tool_use_id"]), bool(b.get("is_error", False)))
        for b in blocks
        if b.get("type") == "tool_result"
    ]
    _gate_slots(task, slots, names)
    return out_message if isinstance(message, Mapping) else blocks


# A tool's images, after its text


def tool_content(
    text: str, images: Sequence[Image], fmt: Literal["responses", "anthropic"]
) -> str | list[dict[str, Any]]:
    """A tool result's content with its images: the text alone where there are none, else
    the text, then the images, as a function_call_output's output (Responses) or a
    tool_result's content (Anthropic) holds them. (A Chat Completions tool message holds
    text only: its images go in chat_images_message.)"""
    if not images:
        return text
    first = {"type": "input_text" if fmt == "responses" else "text", "text": text}
    return [first, *(image_part(image.data_url(), fmt) for image in images)]


def chat_images_message(step: Sequence[tuple[str, Sequence[Image]]]) -> dict[str, Any] | None:
    """The user message that shows one step's images in Chat Completions, to go right after
    the step's tool messages (which hold text only): for each image, a text part naming the
    call and the artifact's path, then the image. None when the step has no image.
    step: (call id, its images) for each call."""
    parts: list[dict[str, Any]] = []
    for call_id, images in step:
        for image in images:
            parts.append({"type": "text", "text": image_caption(call_id, image.path)})
            parts.append(image_part(image.data_url(), "openai"))
    return {"role": "user", "content": parts} if parts else None


def image_caption(call_id: str, path: str) -> str:
    """What a Chat Completions user message says before an image a tool call returned."""
    return f"Image returned by tool call {call_id}: {path}"


def image_part(url: str, fmt: Format) -> dict[str, Any]:
    """An image in a provider's content shape, from its URL (a data URL for spillbox's)."""
    if fmt == "openai":
        return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}
    if fmt == "responses":
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    header, comma, data = url.partition(",")
    if url.startswith("data:") and header.endswith(";base64") and comma:
        mime = header.removeprefix("data:").removesuffix(";base64")
        return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


_TEXT_PARTS = ("text", "input_text", "output_text")
_IMAGE_PARTS = ("image", "input_image", "image_url")
"""Parts the gate does not count: a model's cost for an image is not text tokens, and
offloading one would not let the model see it. Every other part is counted."""


VALUE_PART = "spillbox_value"
"""The type of the part that stands, in what the gate counts, for an element of a content
list that is not a part (a bare string, a list, a number), or for content that is neither
text nor a list (one part given bare, a number, None): it is counted and stored like any
other part, so nothing in a shape the adapter does not know slips past the gate."""


def _parts(content: Any) -> list[Mapping[str, Any]]:
    """The parts of a content field: a plain string among them (LangChain's content lists
    mix them with dicts) is a text part; any other element that is not a part (a list, a
    number), or content that is neither text nor a list, is a value part."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, Mapping):
        return [content]
    if not isinstance(content, list | tuple):
        return [{"type": VALUE_PART, "value": content}]
    return [
        {"type": "text", "text": p}
        if isinstance(p, str)
        else p
        if isinstance(p, Mapping)
        else {"type": VALUE_PART, "value": p}
        for p in content
    ]


def _bare(part: Mapping[str, Any]) -> Any:
    """A part as its content had it: a value part as its bare value."""
    return part.get("value") if part.get("type") == VALUE_PART else part


def _is_other(part: Mapping[str, Any]) -> bool:
    """A part the gate counts that is not text: an Anthropic document or search_result, a
    Responses input_file."""
    return part.get("type") not in (*_TEXT_PARTS, *_IMAGE_PARTS)


def counted_content(content: Any) -> str:
    """What the gate counts and stores of a content field: its text (a string, or its text
    parts joined); where it has parts besides text and images, one JSON object of the text
    and those parts, `{"text": ..., "parts": [...]}`, so that none of what the model reads
    slips past the gate."""
    if isinstance(content, str):
        return content
    parts = _parts(content)
    text = "".join(str(p.get("text", "")) for p in parts if p.get("type") in _TEXT_PARTS)
    others = [dict(p) for p in parts if _is_other(p)]
    if not others:
        return text
    # default=str: a value JSON cannot hold (bytes, an object) is counted as its text.
    return json.dumps({"text": text, "parts": others}, ensure_ascii=False, default=str)


def _with_text(content: Any, text: str) -> Any:
    """content with text (a notice) in place of what the gate counted: one text part, where
    the first counted part was; the images where they were."""
    parts = _parts(content)
    kind = next((p["type"] for p in parts if p.get("type") in _TEXT_PARTS), None)
    if kind is None:
        kind = (
            "input_text" if any(str(p.get("type")).startswith("input_") for p in parts) else "text"
        )
    out: list[dict[str, Any]] = []
    placed = False
    for part in parts:
        if part.get("type") in _IMAGE_PARTS:
            out.append(dict(part))
        elif not placed:
            out.append({"type": kind, "text": text})
            placed = True
    if not placed:
        out.insert(0, {"type": kind, "text": text})
    return text if len(out) == 1 else out


def _with_redacted(content: Any, redacted: str) -> Any:
    """content with each part the gate counted taken from redacted (the redacted text of
    counted_content(content)): its text parts as one, where the first was; its other parts in
    their places. Where redacted does not read back into those parts, the redacted text
    stands in their place, as a notice would."""
    parts = _parts(content)
    others = [p for p in parts if _is_other(p)]
    if not others:
        return _with_text(content, redacted)
    try:
        parsed = json.loads(redacted)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("parts"), list):
        return _with_text(content, redacted)
    taken = [part for part in parsed["parts"] if isinstance(part, dict)]
    if len(taken) != len(others) or not isinstance(parsed.get("text"), str):
        return _with_text(content, redacted)
    out: list[Any] = []
    placed = False
    for part in parts:
        if _is_other(part):
            out.append(_bare(taken.pop(0)))
        elif part.get("type") in _IMAGE_PARTS:
            out.append(dict(part))
        elif not placed:  # the text parts were counted joined: one holds them
            out.append({"type": part["type"], "text": parsed["text"]})
            placed = True
    return out if isinstance(content, list | tuple) else out[0]


# History compaction


def compact_history(
    task: TaskHandle,
    messages: Sequence[Mapping[str, Any]],
    keep_last: int = 3,
    min_tokens: int = 500,
) -> list[dict[str, Any]]:
    """Move all but the last keep_last tool results into the task's sandbox.

    Works on Chat Completions tool messages, Responses function_call_output items and
    Anthropic tool_result blocks. Each moved result is stored byte for byte and replaced
    by its notice (read_artifact opens it again); results under min_tokens, and ones
    that already are notices, stay. Nothing is summarised away.
    """
    out = copy.deepcopy([dict(m) for m in messages])
    slots = list(_result_slots(out))
    names = _call_names(out)
    for holder, key, call_id in slots[: max(len(slots) - keep_last, 0)]:
        text = counted_content(holder[key])
        # "Under min_tokens?" costs time bounded by min_tokens, not by the result's size.
        small, _ = count_within(task.counter, text, min_tokens - 1)
        if parse_notice(text) is not None or (min_tokens > 0 and small):
            continue
        admitted = task.offload(ToolResult(call_id, names.get(call_id, DEFAULT_TOOL_NAME), text))
        holder[key] = _with_text(holder[key], admitted.text)
    return out


def tool_results(messages: Sequence[Mapping[str, Any]]) -> list[ToolResult]:
    """The tool results in a conversation (any of the three shapes), oldest first, with
    their tools' names: what a provider's compaction or clearing would take away."""
    listed = [dict(m) for m in messages]
    names = _call_names(listed)
    return [
        ToolResult(call_id, names.get(call_id, DEFAULT_TOOL_NAME), counted_content(holder[key]))
        for holder, key, call_id in _result_slots(listed)
    ]


def _result_slots(messages: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], str, str]]:
    """(the dict holding a tool result, its key, the call id), oldest first."""
    for message in messages:
        if message.get("role") == "tool":
            yield message, "content", str(message["tool_call_id"])
        elif message.get("type") == "function_call_output":
            yield message, "output", str(message["call_id"])
        elif isinstance(message.get("content"), list):
            for block in message["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    yield block, "content", str(block["tool_use_id"])


def _call_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            names[str(call["id"])] = str(call.get("function", {}).get("name", DEFAULT_TOOL_NAME))
        if message.get("type") == "function_call":
            names[str(message["call_id"])] = str(message.get("name", DEFAULT_TOOL_NAME))
        if isinstance(message.get("content"), list):
            for block in message["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    names[str(block["id"])] = str(block.get("name", DEFAULT_TOOL_NAME))
    return names
