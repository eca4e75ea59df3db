"""A tools/call result through the gate: what of it is counted and stored, and what the
client gets back.

- Every part of a result that a client may show the model is counted and stored, so that
  none slips past the gate (Claude Code shows structuredContent in place of the text): its
  text (the text blocks, one as it is, several joined by a newline), its structuredContent,
  its embedded resources (their text, or their blob: a blob of UTF-8 text as that text,
  under BLOB_TEXT, else its base64), its resource links (every field) and its _meta.
- Where there is text alone, the text is counted and stored as it is; where there is a
  structuredContent alone, its JSON. Otherwise all the parts, as one JSON object
  `{"text": ..., "structuredContent": ..., "resources": [...], "resource_links": [...],
  "_meta": ...}` (the keys of the parts there are). A structuredContent that repeats the
  text (the spec asks servers to repeat structured content as text: the text is its JSON,
  or it holds the text as a string with at most REPEAT_ENVELOPE_BYTES besides and no
  secret in them, like server-filesystem's `{"content": text}`) is not counted again.
- Images and audio pass through untouched and do not count: a model's cost for them is not
  text tokens, and offloading an image would not let the model see it. Nor does a copy of
  their base64 in structuredContent (server-filesystem's read_media_file repeats it there).
- A result that stays inline is returned exactly as the server sent it, unless redaction
  (a redacting policy) replaced a secret in what was counted: then every part counted is
  read back from the redacted text (several text blocks as one), so that the client gets
  exactly what was redacted and logged. Where that cannot be done (the redacted text no
  longer parses into those parts, or its structuredContent no longer fits the tool's
  outputSchema), the result is handled as an offloaded one, with the redacted text in the
  notice's place.
- An offloaded (or withheld) one keeps its images, audio and isError; its text becomes the
  notice (an offloaded one's followed by a resource_link to the payload,
  spillbox.mcp.links), the other parts counted are left out (they are in the payload),
  and its structuredContent becomes a value carrying the notice that the tool's
  outputSchema accepts (see spillbox.mcp.conform), or goes when the tool declares none.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import mcp_types as types
from pydantic import BaseModel

from spillbox.mcp.conform import conforming, valid
from spillbox.redaction import redact_payload
from spillbox.types import Admitted, ToolResult

NO_CONFORMING_VALUE = (
    "[spillbox] this tool's outputSchema admits no value that can carry the text below, so "
    "the result is marked as an error for the client to accept it; the tool itself "
    "succeeded.\n"
)


REPEAT_ENVELOPE_BYTES = 256
"""What structuredContent may hold besides copies of the text and still count as a repeat
of it (server-filesystem's `{"content": text}` holds 13 bytes besides)."""

STRUCTURED, RESOURCES, LINKS, META = "structuredContent", "resources", "resource_links", "_meta"
"""The keys of a result's parts in what is counted and stored (besides "text")."""
BLOB_TEXT = "blob_text"
"""In place of an embedded resource's "blob" where the blob's bytes are UTF-8 text: that text."""


def tool_result(call_id: str, tool: str, result: types.CallToolResult) -> ToolResult:
    """The gate's view of a tools/call result: every part of it a client may show."""
    return ToolResult(call_id, tool, counted(result), is_error=result.is_error)


def counted(result: types.CallToolResult) -> str:
    """What the gate counts and stores of result (the rules are in the module's docstring)."""
    text = _text(result)
    parts = _parts(result, text)
    if not parts:
        return text or ""
    if text is None and list(parts) == [STRUCTURED]:
        return _json(parts[STRUCTURED])
    return _json({"text": text, **parts} if text is not None else parts)


def _text(result: types.CallToolResult) -> str | None:
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    return "\n".join(texts) if texts else None


def _parts(result: types.CallToolResult, text: str | None) -> dict[str, Any]:
    """What a client may show of result besides its text, by the key it has in the stored
    JSON; structuredContent only where it says more than text."""
    parts: dict[str, Any] = {}
    structured = result.structured_content
    media = _media(result)
    if structured is not None and media:
        # A copy of an image's or audio's base64 (server-filesystem's read_media_file) is
        # no text for the model, as the block it repeats is not: it counts as "".
        structured = _without(structured, media)
    if structured is not None and (text is None or not _repeats(structured, text)):
        parts[STRUCTURED] = structured
    resources = [_resource(b) for b in result.content if isinstance(b, types.EmbeddedResource)]
    if resources:
        parts[RESOURCES] = resources
    links = [_dump(b) for b in result.content if isinstance(b, types.ResourceLink)]
    if links:
        parts[LINKS] = links
    if result.meta:
        parts[META] = result.meta
    return parts


def _media(result: types.CallToolResult) -> set[str]:
    """The base64 of result's images and audio."""
    return {
        b.data for b in result.content if isinstance(b, types.ImageContent | types.AudioContent)
    }


def _resource(block: types.EmbeddedResource) -> dict[str, Any]:
    """An embedded resource as the wire has it, but a blob of UTF-8 text as that text."""
    shown: dict[str, Any] = _blobs_as_text(_dump(block))
    return shown


def _embedded(shown: Any) -> types.EmbeddedResource:
    """The embedded resource _resource showed as shown."""
    return types.EmbeddedResource.model_validate(_texts_as_blobs(shown))


def _blobs_as_text(value: Any) -> Any:
    """value (a dumped message) with every blob of UTF-8 text as that text, under BLOB_TEXT,
    so that its secrets can be found and it is counted as the text it is (a binary blob
    stays, counted as its base64)."""
    if isinstance(value, list):
        return [_blobs_as_text(item) for item in value]
    if not isinstance(value, dict):
        return value
    shown = {key: _blobs_as_text(item) for key, item in value.items()}
    blob = shown.get("blob")
    if isinstance(blob, str):
        try:
            text = base64.b64decode(blob, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return shown
        del shown["blob"]
        shown[BLOB_TEXT] = text
    return shown


def _texts_as_blobs(shown: Any) -> Any:
    """What _blobs_as_text showed, its blobs base64 again."""
    if isinstance(shown, list):
        return [_texts_as_blobs(item) for item in shown]
    if not isinstance(shown, dict):
        return shown
    value = {key: _texts_as_blobs(item) for key, item in shown.items()}
    if isinstance(value.get(BLOB_TEXT), str):
        value["blob"] = base64.b64encode(value.pop(BLOB_TEXT).encode("utf-8")).decode("ascii")
    return value


ResultT = TypeVar("ResultT", bound=BaseModel)


def redacted_passed(result: ResultT, redacted: Callable[[str], str]) -> ResultT:
    """A result the proxy passes on around the gate (an upstream's resources/read or
    prompts/get) with every string in it as redacted gives it (the task's redaction, which
    logs what it replaced), read as a JSON parser reads it, blobs of UTF-8 text as that
    text; result itself where nothing was replaced. A ValueError (or ValidationError) where
    the redacted result does not read back: then nothing of it may reach the client."""
    shown = _blobs_as_text(_dump(result))
    text = json.dumps(shown, ensure_ascii=False)
    after = redacted(text)
    if after == text:
        return result
    return type(result).model_validate(_texts_as_blobs(json.loads(after)))


def _dump(block: BaseModel) -> dict[str, Any]:
    dumped: dict[str, Any] = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


def _repeats(structured: Any, text: str) -> bool:
    """Whether structured says no more than text: text is its JSON, or it is text in an
    envelope of at most REPEAT_ENVELOPE_BYTES that holds no secret (a secret there would
    reach the client unscanned, as the envelope is not counted)."""
    if _is_json_of(text, structured):
        return True
    envelope = _json(_without(structured, text))
    if len(envelope.encode()) > REPEAT_ENVELOPE_BYTES or envelope == _json(structured):
        return False
    return redact_payload(envelope.encode()).count == 0


def _is_json_of(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False


def _without(value: Any, text: str | Collection[str], instead: str = "") -> Any:
    """value with every string equal to text (or one of texts) replaced by instead."""
    if isinstance(value, str):
        matched = value == text if isinstance(text, str) else value in text
        return instead if matched else value
    if isinstance(value, dict):
        return {key: _without(item, text, instead) for key, item in value.items()}
    if isinstance(value, list):
        return [_without(item, text, instead) for item in value]
    return value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def replaced(admitted: Admitted) -> bool:
    """Whether the client gets admitted's text (a notice, a refusal) in place of what the
    gate counted, not the result itself."""
    return admitted.offloaded or admitted.reason in ("withheld", "refused")


def gated(
    result: types.CallToolResult,
    admitted: Admitted,
    output_schema: Mapping[str, Any] | None,
    link: types.ResourceLink | None = None,
) -> types.CallToolResult:
    """The result the client gets: the server's own; the notice (or a refusal) in its
    place (followed by link, to the stored payload, if given); or, where redaction replaced
    a secret in what the gate counted (counted(result)), the result rebuilt from the
    redacted text."""
    if replaced(admitted):
        return _replaced(result, admitted.text, output_schema, link)
    if admitted.text == counted(result):
        return result
    rebuilt = _rebuilt(result, admitted.text, output_schema)
    return rebuilt if rebuilt is not None else _replaced(result, admitted.text, output_schema)


def _replaced(
    result: types.CallToolResult,
    text: str,
    output_schema: Mapping[str, Any] | None,
    link: types.ResourceLink | None = None,
) -> types.CallToolResult:
    """result with text in place of every part the gate counted; its images and audio stay."""
    is_error = result.is_error
    structured: Any = None
    if output_schema is not None and not is_error:
        structured = conforming(output_schema, text)
        if structured is None:
            text, is_error = NO_CONFORMING_VALUE + text, True
    uncounted = [
        b for b in result.content if isinstance(b, types.ImageContent | types.AudioContent)
    ]
    return types.CallToolResult(
        content=[types.TextContent(text=text), *([link] if link else []), *uncounted],
        structured_content=structured,
        is_error=is_error,
    )


def _rebuilt(
    result: types.CallToolResult, redacted: str, output_schema: Mapping[str, Any] | None
) -> types.CallToolResult | None:
    """result with each part the gate counted taken from redacted, the redacted text of
    counted(result); None where redacted cannot be read back into those parts, or gives a
    structuredContent the tool's outputSchema rejects."""
    text = _text(result)
    try:
        shown = _read_back(redacted, text, _parts(result, text))
        if shown is None:
            return None
        structured = shown.get(STRUCTURED)
        media = _media(result)
        if STRUCTURED in shown and _without(result.structured_content, media) != (
            result.structured_content
        ):
            return None  # it was counted without the media's base64: it cannot be read back
        if STRUCTURED not in shown and result.structured_content is not None:
            # Left out of what was counted as a repeat of the text: it repeats the redacted text.
            structured = _repeated(result.structured_content, str(text), shown["text"])
        resources = [_embedded(item) for item in shown.get(RESOURCES, [])]
        links = [types.ResourceLink.model_validate(item) for item in shown.get(LINKS, [])]
        content: list[types.ContentBlock] = []
        text_placed = False
        for block in result.content:
            if isinstance(block, types.TextContent):
                if not text_placed:  # the text blocks were counted joined: one holds them
                    content.append(block.model_copy(update={"text": shown["text"]}))
                    text_placed = True
            elif isinstance(block, types.EmbeddedResource):
                content.append(resources.pop(0))
            elif isinstance(block, types.ResourceLink):
                content.append(links.pop(0))
            else:
                content.append(block)
        if resources or links:
            return None
        rebuilt = types.CallToolResult(
            content=content,
            structured_content=structured,
            is_error=result.is_error,
            _meta=shown.get(META),
        )
    except (ValueError, TypeError, KeyError, IndexError):  # pydantic's errors are ValueErrors
        return None
    if output_schema is not None and not result.is_error and not valid(output_schema, structured):
        return None
    return rebuilt


def _read_back(redacted: str, text: str | None, parts: dict[str, Any]) -> dict[str, Any] | None:
    """The parts counted (and "text"), as counted() wrote them, read from redacted; None if
    it does not hold the same parts. Raises ValueError where it is not JSON."""
    if not parts:
        return {"text": redacted}
    if text is None and list(parts) == [STRUCTURED]:
        return {STRUCTURED: json.loads(redacted)}
    shown = json.loads(redacted)
    keys = {*parts, *(["text"] if text is not None else [])}
    return shown if isinstance(shown, dict) and set(shown) == keys else None


def _repeated(structured: Any, text: str, redacted: str) -> Any:
    """The structuredContent that repeats text, as it repeats redacted (text redacted)."""
    if _is_json_of(text, structured):
        return json.loads(redacted)
    return _without(structured, text, redacted)
