"""A tools/call result through the gate: what of it is counted and stored, and what the
client gets back.

- The text is what is counted and stored: the text blocks, one as it is, several joined
  by a newline. A result with structuredContent and no text (the spec asks servers to
  repeat structured content as text, and they do) is stored as that JSON.
- Images, audio, resource links and embedded resources pass through untouched and do not
  count: a model's cost for them is not text tokens.
- A result that stays inline is returned exactly as the server sent it. An offloaded (or
  withheld) one keeps its non-text blocks, _meta and isError; its text becomes the notice,
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


def tool_result(call_id: str, tool: str, result: types.CallToolResult) -> ToolResult:
    """The gate's view of a tools/call result."""
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    if texts:
        content = texts[0] if len(texts) == 1 else "\n".join(texts)
    elif result.structured_content is not None:
        content = json.dumps(result.structured_content, ensure_ascii=False)
    else:
        content = ""
    return ToolResult(call_id, tool, content, is_error=result.is_error)


def gated(
    result: types.CallToolResult,
    admitted: Admitted,
    output_schema: Mapping[str, Any] | None,
) -> types.CallToolResult:
    """The result the client gets: the server's own, or the notice in its place."""
    if not admitted.offloaded and admitted.reason != "withheld":
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
        content=[types.TextContent(text=text), *others],
        structured_content=structured,
        is_error=is_error,
        _meta=result.meta,
    )
