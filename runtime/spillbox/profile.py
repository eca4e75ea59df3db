"""What a payload is: JSON array or object, NDJSON, CSV, text lines, or binary.

The profile feeds the notice and picks the file extension. It reads at most
PROFILE_BUDGET_BYTES of a payload (an array's elements one by one, with the C parser; an
object with a streaming parser), so a 40 MB result is described in milliseconds; counts
beyond the budget are estimates and say so. A JSON object (an API response that wraps its
records) up to SCAN_BUDGET_BYTES is parsed whole by simdjson instead, so every key and
every array's length is exact.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import Any

import ijson
import puremagic
import simdjson

from spillbox.types import ArrayFacts, Shape, Text

PROFILE_BUDGET_BYTES = 256 * 1024
"""How much of a payload the profiler parses; beyond it, counts are extrapolated."""
SCAN_BUDGET_BYTES = 32 * 1024 * 1024
"""A JSON object up to this size is parsed whole by simdjson: all its keys and its arrays'
lengths, exact. A fresh parser takes about 2 ms per MB of API records here (1-3 % of a
full token count, at any size) and holds 2-4 times the payload while it parses: the
memory, not the time, sets the bound. Beyond it the object is read from both ends."""
SCAN_BUDGET_VALUES = 500_000
"""Nor more JSON values than this, estimated from the commas in a few windows: simdjson's
time grows with the values as much as with the bytes (16 MB of small numbers, 4 million
values, took 450 ms), and 500,000 take some 40-70 ms."""
_VALUE_WINDOWS = 16
_VALUE_WINDOW_BYTES = 64 * 1024
MAX_KEY_LOOKUPS = 1_000
"""Keys of a scanned object whose values are looked at: what they hold and where its
arrays are (a thousand lookups cost a few ms)."""
KIND_SAMPLE = 1_000
"""A scanned array's element kinds are those of its first KIND_SAMPLE elements and its
last: walking every element of a million-element array costs a Python call each."""
TAIL_BUDGET_BYTES = 16 * 1024
"""How much of a large JSON object's end the profiler reads backwards, for the keys that
follow its records (Slack's has_more, GraphQL's pageInfo) and where the records end."""
RECORDS_MAX_DEPTH = 4
"""How many keys deep the profile looks for arrays: GraphQL's data.repository.pullRequests.nodes."""
MAX_ARRAYS = 32
"""Arrays described per object at most (the first in document order)."""
MAX_EVENTS = 40_000
"""Parser events a large object's head stops after, within the byte budget: small dense
records (ids, short names) give four times the events per byte of typical API records."""
_OBJECT_BUF_BYTES = 16 * 1024
"""ijson's read size for objects: positions are known to within it, so small reads make
the extrapolated counts closer."""
_TAIL_QUICK_QUOTES = 64
_LONG_STRING = 1024
"""A string longer than this counts against the tail's budget as this long: skipping it
costs a few rfind calls whatever its length."""

_SNIFF_LINES = 20
TEXT_WINDOW_CHARS = 1 << 20
"""How much of a text is read at a time where all of it must be looked at."""
_SCALAR = re.compile(
    rb"[ \t\n\r]*(?:-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|-Infinity|true|false|null)"
    rb"[ \t\n\r]*"
)
"""A JSON number or literal alone, as json.loads reads one (-Infinity too)."""
_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
"""What str.splitlines ends a line at."""
LONG_STRING_CHARS = 256
"""A run of base64 (or hex) characters this long makes a JSON payload's shape say
long_strings: its hints show long strings cut, so that they answer in a few lines."""
BINARY_WINDOWS = 16
BINARY_WINDOW_BYTES = 16 * 1024
"""Where a large payload is looked at for such runs: windows spread over it (a payload
whose blobs are a good share of its bytes has them in some window; a full scan of a
70 MB payload took a second here)."""
_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-\\"
"""Base64's characters, base64url's and the backslash of JSON's escaped slash."""
_AS_RUNS = bytes(0x61 if i in _BASE64 else 0x20 for i in range(256))
"""Each byte as "a" if base64, else a space: a long run is then a plain find (a regex
backtracks over every shorter run, quadratically)."""


def profile(data: bytes, text: Text | None) -> Shape:
    """Describe a payload; text is its UTF-8 decoding (spillbox.types.text_of), or None if
    it is not valid UTF-8. Text is read in windows: a LargeText is never decoded whole."""
    if text is None:
        return Shape(kind="binary", mime=_sniff_mime(data))
    opening = _first_chars(text)
    if opening[:1] in ("[", "{"):
        shape = _json_shape(data, text) or _ndjson_shape(data, text)
        if shape is not None:
            return replace(shape, long_strings=_has_binary_string(data))
    elif (
        opening[:1] in ('"', "-")
        or opening[:1].isdigit()
        or opening.startswith(("true", "false", "null"))
    ):
        if _is_scalar(text, opening):
            return Shape(kind="json_scalar")
    return _csv_shape(data, text) or Shape(kind="text", count=_line_count(data))


def _is_scalar(text: Text, opening: str) -> bool:
    """Whether text is one JSON value that is no array or object, as json.loads has it.
    A LargeText's number or literal is matched on its bytes, which are not decoded (a log
    starting with a digit is no number by its second line); a string is parsed whole."""
    if isinstance(text, str) or opening.startswith('"'):
        try:
            json.loads(text if isinstance(text, str) else text.data)
        except ValueError:
            return False
        return True
    return _SCALAR.fullmatch(text.data) is not None


def _windows(text: Text, start: int = 0) -> Iterator[str]:
    """text from start on, TEXT_WINDOW_CHARS at a time."""
    for at in range(start, len(text), TEXT_WINDOW_CHARS):
        yield text[at : at + TEXT_WINDOW_CHARS]


def _first_chars(text: Text) -> str:
    """The first few characters after the text's leading whitespace (as str.lstrip has it)."""
    for at in range(0, len(text), TEXT_WINDOW_CHARS):
        rest = text[at : at + TEXT_WINDOW_CHARS].lstrip()
        if rest:
            end = at + TEXT_WINDOW_CHARS
            return (rest[:5] + text[end : end + 5])[:5]
    return ""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEGMENT = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_]*)|\.?\[("(?:[^"\\]|\\.)*")\]')


def _has_binary_string(data: bytes) -> bool:
    """Whether data holds a run of LONG_STRING_CHARS base64 characters (within the windows
    looked at: all of it up to BINARY_WINDOWS * BINARY_WINDOW_BYTES)."""
    run = b"a" * LONG_STRING_CHARS
    if len(data) <= BINARY_WINDOWS * BINARY_WINDOW_BYTES:
        return data.translate(_AS_RUNS).find(run) >= 0
    step = (len(data) - BINARY_WINDOW_BYTES) // (BINARY_WINDOWS - 1)
    return any(
        data[at : at + BINARY_WINDOW_BYTES].translate(_AS_RUNS).find(run) >= 0
        for at in range(0, len(data) - BINARY_WINDOW_BYTES + 1, step)
    )


def path_text(path: tuple[str, ...]) -> str:
    """A records path as the notice and read_artifact write it: data.search.nodes, with a
    key that is not a plain name JSON-quoted in brackets (["a.b"].items)."""
    parts = [
        ("." if index else "") + key if _NAME.fullmatch(key) else f"[{json.dumps(key)}]"
        for index, key in enumerate(path)
    ]
    return "".join(parts)


def parse_path(text: str) -> tuple[str, ...]:
    """The keys of a path written as path_text writes it; a leading $ or . is allowed, and
    "", "$" or "." is the top. Raises ValueError for anything else."""
    rest = text.strip().removeprefix("$")
    if rest in ("", "."):
        return ()
    keys: list[str] = []
    position = 0
    while position < len(rest):
        match = _SEGMENT.match(rest, position)
        if match is None or (keys and match.group(1) and rest[position] != "."):
            raise ValueError(
                f"records path {text!r} is not a path: write keys with dots, e.g. "
                'data.search.nodes, and a key with other characters as ["a.b"]'
            )
        keys.append(match.group(1) or json.loads(match.group(2)))
        position = match.end()
    return tuple(keys)


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


def _json_shape(data: bytes, text: Text) -> Shape | None:
    """The shape of a JSON array or object; None if the payload is not one JSON value.

    A payload within the budget is parsed whole by the C parser (a tenth of the streaming
    parser's time); a larger array element by element by the same parser, up to the
    budget; a larger object within the scan budget by simdjson; anything else, or what
    they cannot parse (nesting too deep, numbers beyond 64 bits), is streamed.
    """
    if len(data) <= PROFILE_BUDGET_BYTES:
        try:
            return loaded_shape(json.loads(data, parse_constant=_reject_constant))
        except ValueError:
            return None
        except RecursionError:
            pass
    elif (opening := data.lstrip()[:1]) == b"[":
        decoded = _decoded_array(text)
        if decoded is not None:
            return decoded
    elif (
        opening == b"{"
        and len(data) <= SCAN_BUDGET_BYTES
        and _values_estimate(data) <= SCAN_BUDGET_VALUES
    ):
        scanned = _scanned_object(data)
        if scanned is not None:
            return scanned
    return _streamed_shape(data)


def _decoded_array(text: Text) -> Shape | None:
    """A JSON array longer than the budget, from the elements in its first
    PROFILE_BUDGET_BYTES characters, each decoded by the C parser (256 KB of API records
    in 1.4-1.7 ms where the streaming parser took 2.5-3.2), and never more of it than
    that, however long an element; None where the streaming parser must decide: an
    element that is not JSON, nesting too deep for the C parser, a first element longer
    than the budget, or data after the array's end (NDJSON)."""
    head = text[:PROFILE_BUDGET_BYTES]
    at = _past_space(head, 0)
    if head[at : at + 1] != "[":
        return None  # space JSON does not allow before it (a form feed)
    kinds: set[str] = set()
    keys: dict[str, None] = {}
    elements = parsed_upto = 0
    finished = False
    at = _past_space(head, at + 1)
    if head[at : at + 1] == "]":
        finished, at = True, at + 1
    while not finished:
        try:
            value, end = _ELEMENT.raw_decode(head, at)
        except json.JSONDecodeError as e:
            cut = e.msg.startswith("Unterminated string") or e.pos >= len(head) - _CUT_MARGIN_CHARS
            if elements and cut:
                break  # the element the head's end cuts short
            return None
        except (ValueError, RecursionError):  # NaN or Infinity; nesting too deep
            return None
        at = _past_space(head, end)
        following = head[at : at + 1]
        if following not in ("]", ","):
            if following and at < len(head) - _CUT_MARGIN_CHARS:
                return None  # not JSON
            break  # the head's end cuts this element ("-12." of -12.5) or what follows it
        elements, parsed_upto = elements + 1, end
        kinds.add(_kind_of(value))
        if isinstance(value, dict):
            keys.update(dict.fromkeys(value))
        if following == "]":
            finished, at = True, at + 1
        else:
            at = _past_space(head, at + 1)
    if not (elements or finished):
        return None  # no whole element in the head
    if finished and not all(_JSON_SPACE.fullmatch(rest) for rest in _windows(text, at)):
        return None  # more after the array
    return _array_shape(elements, finished, parsed_upto, len(text), kinds, keys)


def _values_estimate(data: bytes) -> int:
    """About how many values a JSON payload holds: its commas (every value but the first
    of a container follows one), counted in evenly spaced windows and scaled up."""
    step = len(data) // _VALUE_WINDOWS
    if step <= _VALUE_WINDOW_BYTES:
        return data.count(b",")
    starts = range(0, _VALUE_WINDOWS * step, step)
    commas = sum(data.count(b",", start, start + _VALUE_WINDOW_BYTES) for start in starts)
    return commas * len(data) // (_VALUE_WINDOW_BYTES * len(starts))


def _scanned_object(data: bytes) -> Shape | None:
    """A JSON object parsed whole by simdjson, a fresh parser each time (one kept would
    keep its buffers, several times the largest payload, for the life of the process);
    None if simdjson does not take it as one object."""
    if b"\\u0000" in data:  # simdjson looks keys up as C strings: one holding NUL is lost
        return None
    try:
        document = simdjson.Parser().parse(data)
    except (ValueError, RuntimeError):  # not JSON, or too deep, or a number out of range
        return None
    if not isinstance(document, simdjson.Object):
        return None
    return loaded_shape(document)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_ELEMENT = json.JSONDecoder(parse_constant=_reject_constant)
_CUT_MARGIN_CHARS = 6
"""How close to the head's end a decoding error may stand and still be the cut: a number,
a literal or a \\uXXXX escape cut short ("fals") fails where it starts, or is followed by
what cannot follow a value ("-12." of -12.5)."""


def _past_space(text: str, at: int) -> int:
    """Where the first character from at on that is not JSON's space stands."""
    match = _JSON_SPACE.match(text, at)
    assert match is not None  # it matches the empty string
    return match.end()


_OBJECTS = (dict, simdjson.Object)
"""What a JSON object is once parsed: simdjson's proxies are not registered as Mapping."""
_ARRAYS = (list, simdjson.Array)


def _kind_of(value: Any) -> str:
    if isinstance(value, _OBJECTS):
        return "object"
    if isinstance(value, _ARRAYS):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):  # before numbers: a bool is an int in Python
        return "boolean"
    return "null" if value is None else "number"


def loaded_shape(value: Any) -> Shape | None:
    """The shape of a parsed JSON array or object (None for a scalar)."""
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
    if isinstance(value, _OBJECTS):
        names = tuple(dict.fromkeys(value.keys()))
        return Shape(
            kind="json_object",
            keys=names,
            nested={key: _kind_of(value[key]) for key in _looked_up(value, names)},
            arrays=tuple(arrays_in(value)),
        )
    return None


def arrays_in(value: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[ArrayFacts]:
    """The arrays of an object (parsed, or simdjson's) reached through keys,
    RECORDS_MAX_DEPTH keys deep at most, in document order (at most MAX_ARRAYS of them)."""
    found = 0
    for key in _looked_up(value, tuple(dict.fromkeys(value.keys()))):
        if found >= MAX_ARRAYS:
            return
        item = value[key]  # not items(): simdjson's converts every value whole
        if isinstance(item, _ARRAYS):
            found += 1
            yield ArrayFacts((*path, key), len(item), True, _element_name(_kinds(item)))
        elif isinstance(item, _OBJECTS) and len(path) + 1 < RECORDS_MAX_DEPTH:
            for facts in arrays_in(item, (*path, key)):
                if found >= MAX_ARRAYS:
                    return
                found += 1
                yield facts


def _looked_up(value: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, ...]:
    """The keys whose values are looked at: all of a parsed dict's; of simdjson's object,
    the first MAX_KEY_LOOKUPS, since it finds a key by walking its keys in order (every
    value of an object of 100,000 keys took 90 s; its keys are all named still)."""
    return names if isinstance(value, dict) else names[:MAX_KEY_LOOKUPS]


def _kinds(array: list[Any] | simdjson.Array) -> set[str]:
    """The kinds of an array's elements: all of a parsed list's, a sample of simdjson's."""
    if isinstance(array, list):
        return {_kind_of(element) for element in array}
    kinds = {_kind_of(element) for element in islice(array, KIND_SAMPLE)}
    if len(array) > KIND_SAMPLE:
        kinds.add(_kind_of(array.at_pointer(f"/{len(array) - 1}")))
    return kinds


def _streamed_shape(data: bytes) -> Shape | None:
    """Stream-parse up to the budget; None if the payload is not exactly one JSON value."""
    if data.lstrip()[:1] == b"{":
        return _streamed_object(data)
    return _streamed_array(data)


def _streamed_array(data: bytes) -> Shape | None:
    """A JSON array, or None (an object is _streamed_object's).

    basic_parse, not parse: parse builds a path string for every event, which costs
    memory quadratic in the nesting depth (100 KB of "[" exhausted 4 GB).
    """
    stream = io.BytesIO(data)
    top: str | None = None
    finished = False
    depth = 0  # containers open before the current event
    element_kinds: set[str] = set()
    keys: dict[str, None] = {}
    elements = 0
    parsed_upto = 0
    try:
        # Numbers stay ints and Decimals (no use_float): yajl's floats and 64-bit ints
        # overflow on valid JSON such as 1e400 or 2**64, which then looked like text.
        for event, value in ijson.basic_parse(stream):
            if top is None:
                top = event
                if top != "start_array":
                    return None
            opens = event in ("start_map", "start_array")
            closes = event in ("end_map", "end_array")
            # The level of the value the event belongs to: 0 is the array, 1 its elements;
            # a map_key sits at its value's level.
            level = depth - 1 if closes else depth
            if closes and level == 0:
                finished = True  # keep going: trailing data (NDJSON) must raise
            elif level == 1:
                if closes or not opens:
                    elements += 1
                    parsed_upto = stream.tell()
                if event in _KIND_NAMES:
                    element_kinds.add(_KIND_NAMES[event])
            elif level == 2 and event == "map_key":
                keys.setdefault(str(value), None)
            depth += 1 if opens else -1 if closes else 0
            read = stream.tell()
            if read > PROFILE_BUDGET_BYTES and (elements or read > 4 * PROFILE_BUDGET_BYTES):
                break
    except ijson.JSONError:
        return None
    if top is None:
        return None
    return _array_shape(elements, finished, parsed_upto, len(data), element_kinds, keys)


def _array_shape(
    elements: int,
    finished: bool,
    parsed_upto: int,
    size: int,
    kinds: set[str],
    keys: dict[str, None],
) -> Shape:
    """A JSON array read from its start: exact if it finished within what was read, else
    its count extrapolated from the elements complete in parsed_upto of size."""
    return Shape(
        kind="json_array",
        count=elements if finished else _extrapolated(elements, parsed_upto, size),
        count_exact=finished,
        element=_element_name(kinds),
        keys=tuple(keys),
    )


def _extrapolated(elements: int, parsed_upto: int, size: int) -> int | None:
    """An array's count from the elements parsed in its first parsed_upto bytes of size."""
    return _estimate(elements * size / parsed_upto) if elements else None


@dataclass
class _Frame:
    """A container open in the stream: an object, or an array with its count so far."""

    kind: str
    path: tuple[str, ...] | None
    """Keys from the top, where reached through objects only and not too deep."""
    key: str = ""
    """For an object: the key whose value comes next."""
    keyed: bool = False
    """For an object: whether its first key has been read."""
    count: int = 0
    kinds: set[str] = field(default_factory=set)
    starts: set[str] = field(default_factory=set)
    """For an array: the first keys of its elements that are objects (a few)."""
    marks: list[tuple[int, int]] = field(default_factory=list)
    """(bytes read, elements complete) each time the parser read more, first and last:
    the elements in a known span of bytes, for extrapolating."""


def _streamed_object(data: bytes) -> Shape | None:
    """A JSON object from its first PROFILE_BUDGET_BYTES, and its last TAIL_BUDGET_BYTES
    read backwards when it is longer; None if the payload is not one JSON object."""
    head = _object_head(data)
    if head is None:
        return None
    facts = {id(frame): _facts(frame) for frame in head.arrays}
    complete = head.finished or _join_tail(data, head, facts)
    return Shape(
        kind="json_object",
        keys=tuple(head.keys),
        nested=head.nested,
        count_exact=complete,
        arrays=tuple(facts.values()),
    )


@dataclass
class _Head:
    """What the head of a JSON object, parsed forwards, showed."""

    stack: list[_Frame]
    """The containers still open where parsing stopped, outermost first."""
    keys: dict[str, None]
    """The top-level keys, in order."""
    nested: dict[str, str]
    """The kind of each top-level key's value."""
    arrays: list[_Frame]
    """The arrays reached through keys (at most MAX_ARRAYS)."""
    finished: bool
    """The object closed in the part parsed."""
    read: int
    """Bytes parsed."""


def _object_head(data: bytes) -> _Head | None:
    """Parse a JSON object forwards up to the budget; None if it is not one (or the part
    read is not JSON)."""
    stream = io.BytesIO(data)
    stack: list[_Frame] = []
    keys: dict[str, None] = {}
    nested: dict[str, str] = {}
    arrays: list[_Frame] = []
    finished = False
    read = 0
    try:
        parsed = ijson.basic_parse(stream, buf_size=_OBJECT_BUF_BYTES)
        for events, (event, value) in enumerate(parsed):
            if finished or (not stack and event != "start_map"):
                return None  # trailing data (NDJSON), or not an object
            if stream.tell() != read:  # the parser read more: mark, and stop past the budget
                _mark(stack, read)
                if read > PROFILE_BUDGET_BYTES or events > MAX_EVENTS:
                    break
                read = stream.tell()
            if event == "map_key":
                stack[-1].key = value
                if len(stack) == 1:
                    keys.setdefault(value, None)
                elif not stack[-1].keyed and stack[-2].kind == "array":
                    _started(stack[-2].starts, value)
                stack[-1].keyed = True
            elif event in ("end_map", "end_array"):
                stack.pop()
                finished = not stack
                if stack and stack[-1].kind == "array":
                    stack[-1].count += 1
            else:
                kind = _KIND_NAMES[event]
                parent = stack[-1] if stack else None
                if parent is not None and parent.kind == "array":
                    parent.kinds.add(kind)
                    parent.count += event not in ("start_map", "start_array")
                elif parent is not None and len(stack) == 1:
                    nested.setdefault(parent.key, kind)
                if event in ("start_map", "start_array"):
                    path = _child_path(parent)
                    stack.append(_Frame(kind, path))
                    if kind == "array" and path is not None and len(arrays) < MAX_ARRAYS:
                        arrays.append(stack[-1])
    except ijson.JSONError:
        return None
    if not stack and not finished:
        return None
    return _Head(stack, keys, nested, arrays, finished, read)


def _join_tail(data: bytes, head: _Head, facts: dict[int, ArrayFacts]) -> bool:
    """Read an object the head did not finish backwards from its end, and pair what is
    open there with what the head left open: the keys found there join the head's, and
    the arrays' facts (by frame) are counted to where they end. Whether the two ends
    together saw every key of the object."""
    tail = _tail_frames(data, head.read)
    for frame in head.stack:
        if frame.kind == "array" and id(frame) in facts:
            facts[id(frame)] = _facts(frame, end=None)  # where it ends is not known yet
    paired = 0
    for depth, (frame, back) in enumerate(zip(head.stack, tail, strict=False)):
        if not _one_container(frame, back):
            break
        paired += 1
        if frame.kind == "array" and id(frame) in facts:
            facts[id(frame)] = _facts(frame, end=back.end)
        for key, kind, counted in reversed(back.members):
            if depth == 0:
                head.keys.setdefault(key, None)
                head.nested.setdefault(key, kind)
            if counted is not None and frame.path is not None:
                path = (*frame.path, key)
                if len(path) <= RECORDS_MAX_DEPTH and len(facts) < MAX_ARRAYS:
                    exact = not counted.jumped
                    facts[id(counted)] = ArrayFacts(
                        path, counted.count, exact, _element_name(counted.kinds)
                    )
    # Read backwards to an array that opens where the head read, the same one at every
    # depth: no key of the object can lie between what the two ends read.
    return paired == len(tail) > 0 and tail[-1].reaches_head


def _child_path(parent: _Frame | None) -> tuple[str, ...] | None:
    """The path of the value that starts in parent (the root's is ())."""
    if parent is None:
        return ()
    if parent.kind != "object" or parent.path is None:
        return None
    return (*parent.path, parent.key) if len(parent.path) < RECORDS_MAX_DEPTH else None


def _mark(stack: list[_Frame], read: int) -> None:
    """The parser is about to read past `read`: every element complete so far ends in it."""
    for frame in stack:
        if frame.kind != "array":
            continue
        if not frame.marks or frame.marks[0][1] == frame.count:
            frame.marks = [(read, frame.count)]  # none complete yet: start from here
        else:
            frame.marks[1:] = [(read, frame.count)]


_STARTS_KEPT = 8
"""First keys kept per array: enough to tell two kinds of records apart."""


def _started(starts: set[str], key: str) -> None:
    if len(starts) < _STARTS_KEPT:
        starts.add(key)


def _one_container(frame: _Frame, back: _Back) -> bool:
    """Whether the container open where the head stops and the one open where the tail
    starts (at the same depth) are one: objects on the way to it are taken to be; an
    array is when the tail found it opens where the head read (see _array_start) and its
    elements are alike (a kind and, where both saw objects, a first key in common).
    Otherwise the head's array gets no count, rather than one stretched to where another
    array ends ({"a": [...], "b": [...]})."""
    if frame.kind != back.kind:
        return False
    if frame.kind == "object":
        return True
    alike = not (frame.starts and back.starts) or bool(frame.starts & back.starts)
    return back.reaches_head and bool(frame.kinds & back.kinds) and alike


def _facts(frame: _Frame, end: int | None = -1) -> ArrayFacts:
    """An array's facts: exact (end -1: it closed in the part read), or its count
    extrapolated from the elements read to `end`, where it ends (None: not known)."""
    assert frame.path is not None
    exact = end == -1
    count: int | None = frame.count
    if not exact:
        count = None
        if end is not None and len(frame.marks) == 2:
            (first_read, first_count), (last_read, last_count) = frame.marks
            if last_count > first_count:
                rate = (last_count - first_count) / (last_read - first_read)
                count = _estimate(max(frame.count, last_count + rate * (end - last_read)))
    return ArrayFacts(frame.path, count, exact, _element_name(frame.kinds))


@dataclass
class _Back:
    """A container entered reading backwards from the end of the payload."""

    kind: str
    end: int
    """Where it closes."""
    named: bool
    """Reached through object keys only, within RECORDS_MAX_DEPTH: its keys matter."""
    members: list[tuple[str, str, _Back | None]] = field(default_factory=list)
    """For an object: (key, kind of value, the value if an array), last first."""
    count: int = 0
    kinds: set[str] = field(default_factory=set)
    first: tuple[int, int] | None = None
    """For an object: where its first key lies (the last read so far, reading backwards)."""
    starts: set[str] = field(default_factory=set)
    """For an array: the first keys of its elements that are objects (a few)."""
    opening: bytes = b""
    """For an array of objects: how its last element read opens, from its brace to the end
    of its first key ({"id"), with the white space before it (after the comma)."""
    jumped: bool = False
    """For an array: its start was searched for (found or not); its count is estimated."""
    reaches_head: bool = False
    """For an array: it opens before the part the tail reads, where the head read."""


_WHITESPACE = b" \t\r\n"
_STOPS = b' \t\r\n,:[]{}"'


def _tail_frames(data: bytes, floor: int) -> list[_Back]:
    """The containers open at the start of the payload's last TAIL_BUDGET_BYTES (or where a
    value too long to read back starts), outermost first, each with what follows there.

    Reading JSON backwards is safe from its end, which is outside every string: a quote
    read there closes a string, and the string opens at the previous quote not escaped
    (preceded by an even run of backslashes). Long strings are skipped with rfind, so a
    3 MB string value costs a few calls, not a 3 MB loop. A long array of objects is
    jumped over to where it opens (_array_start), its length estimated from the elements
    read, and reading goes on before it: the keys between two arrays are named, and an
    array found to open where the head read is the head's own (reaches_head).
    """
    return _TailReader(data, floor).read()


class _TailReader:
    """One backward read of a payload, from its end down to floor (see _tail_frames)."""

    def __init__(self, data: bytes, floor: int) -> None:
        self.data = data
        self.floor = floor
        self.i = len(data)
        """Where reading is: the bytes from i on are read (or jumped over)."""
        self.stack: list[_Back] = []
        self.pending: tuple[str, _Back | None] | None = None
        """A value read, its key not yet."""
        self.after_colon = False
        self.skipped = 0
        """Bytes of long strings and long arrays jumped over, not read."""
        self.allowance = TAIL_BUDGET_BYTES
        self.jumps = 0

    def read(self) -> list[_Back]:
        data, floor = self.data, self.floor
        while True:
            while self.i > floor and data[self.i - 1] in _WHITESPACE:
                self.i -= 1
            over = len(data) - self.i - self.skipped > self.allowance
            if self._jumps_now(over):
                start = self._jump()
                if start is None:  # it opens where the head read
                    break
                if start >= 0:
                    continue
            if self.i <= floor or over or not self._token():
                break
        return self.stack

    def _jumps_now(self, over: bool) -> bool:
        top = self.stack[-1] if self.stack else None
        return (
            self.i > self.floor
            and top is not None
            and self.jumps < _MAX_JUMPS
            and _may_jump(top, self.i, over)
        )

    def _jump(self) -> int | None:
        """Search for where the array being read opens, and go on reading before it (its
        count estimated): where it opens; None if where the head read, -1 if not found."""
        top = self.stack[-1]
        top.jumped = True
        self.jumps += 1
        start = _array_start(self.data, self.floor, self.i, top)
        if start is None:
            top.reaches_head = True
        elif start >= 0:
            # The elements jumped over, at the rate of those read.
            top.count = _estimate(top.count * (top.end - start) / (top.end - self.i))
            self.skipped += self.i - start - 1
            self.allowance += TAIL_BUDGET_BYTES
            self.i = start + 1
        return start

    def _token(self) -> bool:
        """Read the token that ends at i; False where reading stops."""
        char = self.data[self.i - 1 : self.i]
        if char == b'"':
            return self._string()
        if char in (b"}", b"]"):
            self._enter("object" if char == b"}" else "array")
            return True
        if char in (b"{", b"["):
            return self._leave()
        if char == b":":
            self.i -= 1
            self.after_colon = True
        elif char == b",":
            self.i -= 1
        else:
            self.pending = _read_back(self.stack, self._scalar(), None)
        return True

    def _string(self) -> bool:
        """A string: an object's key (after its value and colon), or a value."""
        close = self.i - 1
        self.i = _string_start(self.data, close, self.floor)
        if self.i < 0:
            return False
        self.skipped += max(close - self.i - _LONG_STRING, 0)
        top = self.stack[-1] if self.stack else None
        key_of = self.pending if self.after_colon else None  # the value this string keys
        if key_of is not None and top is not None and top.kind == "object":
            if top.named:
                top.members.append((_decoded(self.data[self.i + 1 : close]), *key_of))
            top.first = (self.i + 1, close)
            self.pending, self.after_colon = None, False
        else:
            self.pending = _read_back(self.stack, "string", None)
        return True

    def _enter(self, kind: str) -> None:
        """A container's end: it is entered."""
        self.i -= 1
        parent = self.stack[-1] if self.stack else None
        named = parent is None or (
            parent.kind == "object" and parent.named and len(self.stack) <= RECORDS_MAX_DEPTH
        )
        entered = _Back(kind, self.i, named)
        _read_back(self.stack, kind, None)
        self.stack.append(entered)
        self.pending = None

    def _leave(self) -> bool:
        """A container's start: it is left (reading stops at the outermost)."""
        self.i -= 1
        if not self.stack:
            return False
        closed = self.stack.pop()
        if not self.stack:
            return False
        parent = self.stack[-1]
        if closed.first is not None and parent.kind == "array":
            _started(parent.starts, _decoded(self.data[closed.first[0] : closed.first[1]]))
            parent.opening = _opening(self.data, self.i, closed.first[1] + 1, self.floor)
        # Counted as an element where it ended, at its "}" or "]": not again here.
        self.pending = (closed.kind, closed if closed.kind == "array" else None)
        return True

    def _scalar(self) -> str:
        """A number or literal that ends at i: its kind."""
        start = self.i - 1
        while start > self.floor and self.data[start - 1 : start] not in _STOPS:
            start -= 1
        token = self.data[start : self.i]
        self.i = start
        return "number" if token[:1] in b"-0123456789" else _LITERALS.get(token, "string")


_LITERALS = {b"true": "boolean", b"false": "boolean", b"null": "null"}
_JUMP_AFTER = 16
"""Elements of an array read backwards before its start is searched for (sooner if the
tail's budget runs out): enough for the rate at which the rest is estimated."""
_JUMP_AFTER_BYTES = TAIL_BUDGET_BYTES // 2
"""Or after this much of it: the budget ends sooner inside an element, out of reach."""
_MAX_JUMPS = 8
_START_TRIES = 8
_CHECK_BYTES = 64 * 1024
"""How far past a candidate start the elements are parsed to check it."""


def _may_jump(top: _Back, i: int, over: bool) -> bool:
    """Whether to search for where the array being read opens (reading from i), and jump
    there: a named array of objects, read far enough for a rate, not searched for yet."""
    return (
        top.kind == "array"
        and top.named
        and bool(top.opening)
        and not top.jumped
        and (over or top.count >= _JUMP_AFTER or top.end - i >= _JUMP_AFTER_BYTES)
    )


def _opening(data: bytes, brace: int, key_end: int, floor: int) -> bytes:
    """How the element whose brace is at `brace` opens (to the end of its first key), with
    the white space between it and the comma before it, if one is there."""
    gap = brace
    while gap > floor and data[gap - 1] in _WHITESPACE:
        gap -= 1
    space = data[gap:brace] if data[gap - 1 : gap] == b"," else b""
    return space + data[brace:key_end]


def _array_start(data: bytes, floor: int, end: int, array: _Back) -> int | None:
    """Where the array of objects being read backwards (from `end`) opens: the nearest
    "[" before `end` followed by an element that opens as its elements do, and which is
    an object's member ("key": [) whose elements parse as a run (simdjson) for up to
    _CHECK_BYTES; None if there is none after floor (it opens where the head read), -1
    if the candidates did not check out.

    A search in C over the bytes between (memchr speed), not a parse: an object's
    records are jumped over to reach the keys before them (two arrays, keys between)."""
    brace = array.opening.lstrip(_WHITESPACE)
    gap = array.opening[: len(array.opening) - len(brace)]
    # Indented JSON opens its first element as it opens the others; compact JSON puts it
    # right after the bracket, whatever follows its commas (", " or ",").
    needle = b"[" + (gap if b"\n" in gap else b"") + brace
    separator = b"," + array.opening
    for _ in range(_START_TRIES):
        start = data.rfind(needle, floor, end)
        if start < 0:
            return None
        if _is_member_value(data, start, floor) and _run_parses(data, start, separator):
            return start
        end = start
    return -1


def _is_member_value(data: bytes, start: int, floor: int) -> bool:
    """Whether the value opening at `start` follows `"key":`, after "," or "{"."""
    i = start
    while i > floor and data[i - 1] in _WHITESPACE:
        i -= 1
    if data[i - 1 : i] != b":":
        return False
    i -= 1
    while i > floor and data[i - 1] in _WHITESPACE:
        i -= 1
    if data[i - 1 : i] != b'"':
        return False
    i = _string_start(data, i - 1, floor)
    while i > floor and data[i - 1] in _WHITESPACE:
        i -= 1
    return i > floor and data[i - 1 : i] in (b",", b"{")


def _run_parses(data: bytes, start: int, separator: bytes) -> bool:
    """Whether the elements after `[` at `start` parse as a run of whole values, up to the
    last separator within _CHECK_BYTES (a candidate inside a string, or a nested array
    that ends sooner, does not); true if no separator is that near."""
    stop = data.rfind(separator, start + 1, start + 1 + _CHECK_BYTES)
    if stop < 0:
        return True
    try:
        run = simdjson.Parser().parse(b"[" + data[start + 1 : stop] + b"]")
    except (ValueError, RuntimeError):
        return False
    return isinstance(run, simdjson.Array)


def _read_back(stack: list[_Back], kind: str, value: _Back | None) -> tuple[str, _Back | None]:
    """A value read backwards: an element of an array, or an object's value, its key next."""
    if stack and stack[-1].kind == "array":
        stack[-1].count += 1
        stack[-1].kinds.add(kind)
    return kind, value


def _string_start(data: bytes, close: int, floor: int) -> int:
    """Where the string that closes at `close` opens; -1 if not after floor."""
    end = close
    for _ in range(_TAIL_QUICK_QUOTES):
        quote = data.rfind(b'"', floor, end)
        if quote < 0:
            return -1
        slashes = quote
        while slashes > floor and data[slashes - 1] == 0x5C:
            slashes -= 1
        if (quote - slashes) % 2 == 0:
            return quote
        end = quote
    # A string full of escaped quotes (JSON inside a string): one search of the bytes
    # reversed, where an unescaped quote is one followed by an even run of backslashes.
    found = _UNESCAPED_QUOTE_REVERSED.search(data[floor:end][::-1])
    return -1 if found is None else end - 1 - found.start()


_UNESCAPED_QUOTE_REVERSED = re.compile(rb'"(?:\\\\)*(?!\\)')


def _decoded(raw: bytes) -> str:
    if b"\\" not in raw:
        return raw.decode("utf-8", "replace")
    try:
        value = json.loads(b'"' + raw + b'"')
    except ValueError:
        return raw.decode("utf-8", "replace")
    return str(value)


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


def _ndjson_shape(data: bytes, text: Text) -> Shape | None:
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
    return Shape(kind="ndjson", count=_nonblank_lines(text), keys=tuple(keys))


def _nonblank_lines(text: Text) -> int:
    """How many lines (as str.splitlines has them) hold more than whitespace, read a window
    at a time: a line that a window's end cuts goes on in the next one."""
    count, going = 0, False  # going: the line under way has more than whitespace
    for window in _windows(text):
        for line in window.splitlines(keepends=True):
            going = going or not line.isspace()
            if line[-1] in _LINE_BREAKS:
                count, going = count + going, False
    return count + going


def _csv_shape(data: bytes, text: Text) -> Shape | None:
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
