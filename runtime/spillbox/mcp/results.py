"""A tools/call result through the gate: what of it is counted and stored, and what the
client gets back.

- Text and structuredContent are counted and stored together: a client may show either
  (Claude Code shows structuredContent in place of the text), so neither may slip past
  the gate. The text is the text blocks, one as it is, several joined by a newline. Where
  the structuredContent repeats the text (the spec asks servers to repeat structured
  content as text: the text is its JSON, or it holds the text as a string with at most
  REPEAT_ENVELOPE_BYTES besides, like server-filesystem's `{"content": text}`), the text
  alone is counted and stored. Where there is no text, the structuredContent's JSON is.
  Otherwise both are, as one JSON object `{"text": ..., "structuredContent": ...}`.
- Images, audio, resource links and embedded resources pass through untouched and do not
  count: a model's cost for them is not text tokens.
- A result that stays inline is returned exactly as the server sent it. An offloaded (or
  withheld) one keeps its non-text blocks, _meta and isError; its text becomes the notice
  (an offloaded one's followed by a resource_link to the payload, spillbox.mcp.links),
  and its structuredContent becomes a value carrying the notice that the tool's
  outputSchema accepts (see spillbox.mcp.conform), or goes when the tool declares none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import mcp_types as types

from spillbox.mcp.conform import conforming
from spillbox.types import Admitted, ToolResult

NO_CONFORMING_VALUE = (
    "[spillbox] this tool's outputSchema admits no value that can carry the notice, so the "
    "result is marked as an error for the client to accept it; the tool itself succeeded.\n"
)


REPEAT_ENVELOPE_BYTES = 256
"""What structuredContent may hold besides copies of the text and still count as a repeat
of it (server-filesystem's `{"content": text}` holds 13 bytes besides)."""


def tool_result(call_id: str, tool: str, result: types.CallToolResult) -> ToolResult:
    """The gate's view of a tools/call result: its text and structuredContent together."""
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    text = "\n".join(texts) if texts else None
    structured = result.structured_content
    if structured is None:
        content = text or ""
    elif text is None:
        content = _json(structured)
    elif _repeats(structured, text):
        content = text
    else:
        content = _json({"text": text, "structuredContent": structured})
    return ToolResult(call_id, tool, content, is_error=result.is_error)


def _repeats(structured: Any, text: str) -> bool:
    """Whether structured says no more than text: text is its JSON, or it is text in an
    envelope of at most REPEAT_ENVELOPE_BYTES."""
    try:
        if json.loads(text) == structured:
            return True
    except ValueError:
        pass
    envelope = _json(_without(structured, text))
    return len(envelope.encode()) <= REPEAT_ENVELOPE_BYTES and envelope != _json(structured)


def _without(value: Any, text: str) -> Any:
    """value with every string equal to text emptied."""
    if isinstance(value, str):
        return "" if value == text else value
    if isinstance(value, dict):
        return {key: _without(item, text) for key, item in value.items()}
    if isinstance(value, list):
        return [_without(item, text) for item in value]
    return value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def gated(
    result: types.CallToolResult,
    admitted: Admitted,
    output_schema: Mapping[str, Any] | None,
    link: types.ResourceLink | None = None,
) -> types.CallToolResult:
    """The result the client gets: the server's own, or the notice in its place (followed
    by link, to the stored payload, if given)."""
    if not admitted.offloaded and admitted.reason not in ("withheld", "refused"):
        return result
    text = admitted.text
    is_error = result.is_error
    structured: Any = None
    if output_schema is not None and not is_error:
        structured = conforming(output_schema, text)
        if structured is None:
            text, is_error = NO_CONFORMING_VALUE + text, True
    others = [block for block in result.content if not isinstance(block, types.TextContent)]
    return types.CallToolResult(
        content=[types.TextContent(text=text), *([link] if link else []), *others],
        structured_content=structured,
        is_error=is_error,
        _meta=result.meta,
    )
