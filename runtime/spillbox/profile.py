"""What a payload is: JSON array or object, NDJSON, CSV, text lines, or binary.

The profile feeds the notice and picks the file extension. It reads at most
PROFILE_BUDGET_BYTES of a payload with a streaming parser, so a 40 MB result is
described in milliseconds; counts beyond the budget are estimates and say so.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import ijson
import puremagic

from spillbox.types import Shape

PROFILE_BUDGET_BYTES = 256 * 1024
"""How much of a payload the profiler parses; beyond it, counts are extrapolated."""

_SNIFF_LINES = 20


def profile(data: bytes, text: str | None) -> Shape:
    """Describe a payload; text is its UTF-8 decoding, or None if it is not valid UTF-8."""
    if text is None:
        return Shape(kind="binary", mime=_sniff_mime(data))
    stripped = text.lstrip()
    if stripped[:1] in ("[", "{"):
        shape = _json_shape(data)
        if shape is not None:
            return shape
        ndjson = _ndjson_shape(data, text)
        if ndjson is not None:
            return ndjson
    elif (
        stripped[:1] in ('"', "-")
        or stripped[:1].isdigit()
        or stripped.startswith(("true", "false", "null"))
    ):
        try:
            json.loads(text)
            return Shape(kind="json_scalar")
        except ValueError:
            pass
    return _csv_shape(data, text) or Shape(kind="text", count=_line_count(data))


def _line_count(data: bytes) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


_KIND_NAMES = {
    "start_map": "object",
    "start_array": "array",
    "string": "string",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
}


def _json_shape(data: bytes) -> Shape | None:
    """The shape of a JSON array or object; None if the payload is not one JSON value.

    A payload within the budget is parsed whole by the C parser (a tenth of the streaming
    parser's time); a larger one, or one nested too deep for it, is streamed.
    """
    if len(data) <= PROFILE_BUDGET_BYTES:
        try:
            return _loaded_shape(json.loads(data, parse_constant=_reject_constant))
        except ValueError:
            return None
        except RecursionError:
            pass
    return _streamed_shape(data)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):  # before numbers: a bool is an int in Python
        return "boolean"
    return "null" if value is None else "number"


def _loaded_shape(value: Any) -> Shape | None:
    if isinstance(value, list):
        keys: dict[str, None] = {}
        for element in value:
            if isinstance(element, dict):
                keys.update(dict.fromkeys(element))
        return Shape(
            kind="json_array",
            count=len(value),
            element=_element_name({_kind_of(element) for element in value}),
            keys=tuple(keys),
        )
    if isinstance(value, dict):
        return Shape(
            kind="json_object",
            keys=tuple(value),
            nested={key: _kind_of(item) for key, item in value.items()},
        )
    return None


def _streamed_shape(data: bytes) -> Shape | None:
    """Stream-parse up to the budget; None if the payload is not exactly one JSON value.

    basic_parse, not parse: parse builds a path string for every event, which costs
    memory quadratic in the nesting depth (100 KB of "[" exhausted 4 GB).
    """
    stream = io.BytesIO(data)
    top: str | None = None
    finished = False
    depth = 0  # containers open before the current event
    key: str | None = None  # the top-level object key whose value comes next
    element_kinds: set[str] = set()
    keys: dict[str, None] = {}
    nested: dict[str, str] = {}
    elements = 0
    parsed_upto = 0
    try:
        # Numbers stay ints and Decimals (no use_float): yajl's floats and 64-bit ints
        # overflow on valid JSON such as 1e400 or 2**64, which then looked like text.
        for event, value in ijson.basic_parse(stream):
            if top is None:
                top = event
                if top not in ("start_array", "start_map"):
                    return None
            opens = event in ("start_map", "start_array")
            closes = event in ("end_map", "end_array")
            # The level of the value the event belongs to: 0 is the top value, 1 its
            # elements or the values of its keys; a map_key sits at its value's level.
            level = depth - 1 if closes else depth
            if closes and level == 0:
                finished = True  # keep going: trailing data (NDJSON) must raise
            elif top == "start_array" and level == 1:
                if closes or not opens:
                    elements += 1
                    parsed_upto = stream.tell()
                if event in _KIND_NAMES:
                    element_kinds.add(_KIND_NAMES[event])
            elif top == "start_array" and level == 2 and event == "map_key":
                keys.setdefault(str(value), None)
            elif top == "start_map" and level == 1:
                if event == "map_key":
                    key = str(value)
                    keys.setdefault(key, None)
                elif key is not None and event in _KIND_NAMES:
                    nested.setdefault(key, _KIND_NAMES[event])
            depth += 1 if opens else -1 if closes else 0
            read = stream.tell()
            if read > PROFILE_BUDGET_BYTES and (
                elements or top == "start_map" or read > 4 * PROFILE_BUDGET_BYTES
            ):
                break
    except ijson.JSONError:
        return None
    if top == "start_array":
        if finished:
            count: int | None = elements
        else:
            count = _estimate(elements * len(data) / parsed_upto) if elements else None
        return Shape(
            kind="json_array",
            count=count,
            count_exact=finished,
            element=_element_name(element_kinds),
            keys=tuple(keys),
        )
    if top == "start_map":
        return Shape(kind="json_object", keys=tuple(keys), nested=nested, count_exact=finished)
    return None


def _estimate(count: float) -> int:
    """An extrapolated count, rounded to the two significant digits it can claim: a notice
    saying "about 398" for an array of 400 would read as more precise than it is."""
    digits = len(str(round(count)))
    return int(round(count, min(0, 2 - digits)))


def _element_name(kinds: set[str]) -> str | None:
    if not kinds:
        return None
    if len(kinds) == 1:
        return next(iter(kinds)) + "s"
    return "mixed values"


def _ndjson_shape(data: bytes, text: str) -> Shape | None:
    """Newline-delimited JSON: every one of the first lines is one JSON value on its own."""
    lines = [
        line for line in text[:PROFILE_BUDGET_BYTES].splitlines()[:_SNIFF_LINES] if line.strip()
    ]
    if len(lines) < 2 and len(text) > PROFILE_BUDGET_BYTES:
        return None
    keys: dict[str, None] = {}
    for line in lines:
        try:
            value: Any = json.loads(line)
        except (ValueError, RecursionError):  # deep nesting ([[[[...) is not NDJSON either
            return None
        if isinstance(value, dict):
            keys.update(dict.fromkeys(str(k) for k in value))
    if len(lines) < 2:
        return None
    count = sum(1 for line in text.splitlines() if line.strip())
    return Shape(kind="ndjson", count=count, keys=tuple(keys))


def _csv_shape(data: bytes, text: str) -> Shape | None:
    """CSV or TSV: the first lines split into the same number (two or more) of fields."""
    head = text[:PROFILE_BUDGET_BYTES].splitlines()[:_SNIFF_LINES]
    if len(head) < 2:
        return None
    first = head[0]
    delimiter = "\t" if first.count("\t") >= max(first.count(","), 1) else ","
    try:
        rows = list(
            csv.reader(head[:-1] if len(head) == _SNIFF_LINES else head, delimiter=delimiter)
        )
    except csv.Error:  # e.g. a line over csv's field size limit: not a table we can read
        return None
    widths = {len(row) for row in rows}
    if len(widths) != 1 or widths.pop() < 2:
        return None
    return Shape(kind="csv", count=_line_count(data) - 1, keys=tuple(rows[0]))


def _sniff_mime(data: bytes) -> str | None:
    try:
        matches = puremagic.magic_string(data[:4096])
    except puremagic.PureError:
        return None
    return matches[0].mime_type or None if matches else None
