"""Reading an artifact back a page at a time, at natural boundaries, under the gate.

A page holds whole records (JSON array elements, NDJSON lines, or the elements of an
array inside a JSON object, after a page for the rest of the object: its envelope), whole
text lines, or a run of bytes; one record or line too big for a page is itself cut into
character slices, so even a 40 MB one-line JSON pages. Each page stays under the per-call
threshold, so reading back never triggers an offload of the offload.

The reader steers: at most `units` records or lines a page, from any record or line
(`first`), records cut down to some of their keys (`fields`). Text pages end where a unit
of the text ends, where one does within the page: a CSV row (and each page after the
first repeats the header), a Markdown section or paragraph, a top-level block of source
code, a log entry with its continuation lines (a stack trace); else at a line break.

Cursors are opaque to the model: a versioned payload signed with HMAC-SHA256 under a
secret kept in the spillbox home, so a tampered, expired or foreign cursor (another
task, another artifact, another home) is refused with a clear error.
"""

from __future__ import annotations

import base64
import binascii
import csv
import hashlib
import hmac
import io
import json
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from spillbox.errors import ConfigError
from spillbox.profile import arrays_in, loaded_shape, path_text
from spillbox.tokens import TokenCounter, count_within

CURSOR_VERSION = 1
CURSOR_TTL_SECONDS = 3600.0
SECRET_FILE = "cursor.key"
PAGE_SHARE = 0.8
"""A page uses at most this share of the per-call threshold; the envelope needs the rest."""
PAGE_UNITS_MAX = 1000
"""The most records or lines a reader may ask a page for (the page budget still cuts)."""
_PARSED_CACHE = 4
_CHARS_PER_TOKEN_GUESS = 4
"""Where the search for a slice's length starts; it doubles or bisects from there."""

Position = tuple[int, int]
"""(record or line or byte index, character offset inside that record or line). A CSV
read with fields pages its rows as records: there the index counts rows, 0 the first
after the header.

For records wrapped in an object, the envelope comes before record 0 and holds none of
the records: its page is at (0, 0) to (0, 0). An envelope too big for one page is sliced
at (0, k) to (0, k'), k counting characters of its JSON; its last slice ends at (0, L), L
its length, where the records start, so a slice of record 0 is then at (0, L + k)."""


UNIT_NAMES = {"records": "record", "envelope": "record", "lines": "line", "bytes": "byte"}
"""What one step of a page's position counts, by the page's unit."""


class CursorError(ConfigError):
    """A cursor that cannot be used: tampered, expired, or made for something else."""


def resume_hint(fields: dict[str, Any]) -> str:
    """Where a signed cursor was, and the call that reads on from there without it."""
    where = _where(fields)
    if where is None:
        return "start again without a cursor"
    args = [f"start={where[1]}"]
    if fields.get("records") is not None:
        args.append(f"records={path_text(tuple(fields['records']))!r}")
    if fields.get("fields") is not None:
        args.append(f"fields={json.dumps(fields['fields'], ensure_ascii=False)}")
    return f"it was at {where[0]}: call again without a cursor, with {', '.join(args)}"


def _where(fields: dict[str, Any]) -> tuple[str, int] | None:
    """A cursor's position in words ("record 240", "inside line 3") and the start that
    reads from there; None if it has none. Only an index and a name from UNIT_NAMES: safe
    to say of a cursor not yet checked."""
    pos = fields.get("pos")
    if not (isinstance(pos, list) and pos and all(type(n) is int and n >= 0 for n in pos)):
        return None
    unit = UNIT_NAMES.get(str(fields.get("unit")), "position")
    words = f"{unit} {pos[0]}" if len(pos) < 2 or not pos[1] else f"inside {unit} {pos[0]}"
    return words, pos[0]


def _claimed(raw: bytes) -> dict[str, Any]:
    """What a cursor that failed its check says of itself, where it says anything."""
    try:
        fields = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return fields if isinstance(fields, dict) else {}


@dataclass(frozen=True)
class Page:
    """One slice of an artifact, as read_artifact returns it."""

    unit: str
    """"records", "envelope", "lines" or "bytes"."""
    start: Position
    end: Position
    total: int
    items: list[Any] | None
    text: str | None
    partial: bool
    """True if this page is a slice of one record or line too big for a page."""
    records: tuple[str, ...] | None = None
    """For records wrapped in an object: the path of the array it walks."""
    envelope: Any = None
    """The envelope, on its page (when it is whole)."""
    fields: tuple[str, ...] | None = None
    """The keys each record was cut down to, when the reader asked for some."""
    header: int = 0
    """How many lines at the start of text repeat a CSV header (lines before `start`):
    joining pages' text drops them from every page that has them."""

    @property
    def has_more(self) -> bool:
        return self.end[0] < self.total

    @property
    def returned(self) -> int:
        """How many records, lines or bytes the page ends: a slice ends one or none."""
        return self.end[0] - self.start[0]


class CursorSigner:
    """Signs and checks cursors with the home's secret (made on first use, mode 0600)."""

    def __init__(self, home: Path) -> None:
        self._key = _secret(home)

    def sign(self, fields: dict[str, Any]) -> str:
        body = json.dumps({"v": CURSOR_VERSION, **fields}, separators=(",", ":"), sort_keys=True)
        raw = body.encode("utf-8")
        tag = hmac.new(self._key, raw, hashlib.sha256).digest()[:16]
        return f"{_b64(raw)}.{_b64(tag)}"

    def check(self, cursor: str, expect: dict[str, Any]) -> dict[str, Any]:
        try:
            body_part, tag_part = cursor.split(".")
            raw, tag = _unb64(body_part), _unb64(tag_part)
        except (ValueError, binascii.Error):
            raise CursorError("cursor is malformed: pass next_cursor exactly as returned") from None
        good = hmac.new(self._key, raw, hashlib.sha256).digest()[:16]
        # Only the exact text signed: base64 decoding ignores spare bits and stray
        # characters, so an edited cursor could otherwise decode to the signed bytes.
        canonical = f"{_b64(raw)}.{_b64(tag)}" == cursor
        if not (canonical and hmac.compare_digest(tag, good)):
            # Its position is unchecked, but only a number: saying it costs nothing and
            # spares a reader whose home's secret changed a walk back from page one.
            where = _where(_claimed(raw))
            resume = (
                f"it says it was at {where[0]}: call again without a cursor, with start={where[1]}"
                if where is not None
                else "start again without a cursor, or with start= the position end of "
                "the last page you read"
            )
            raise CursorError(
                "cursor is not valid here (tampered, or made by another spillbox home); " + resume
            )
        fields: dict[str, Any] = json.loads(raw)
        if fields.get("v") != CURSOR_VERSION:
            raise CursorError(
                f"cursor version {fields.get('v')} is not supported: start again without a cursor"
            )
        for key, value in expect.items():
            if fields.get(key) != value:
                there = _where(fields)
                raise CursorError(
                    f"cursor belongs to another {key} ({fields.get(key)!r}, not {value!r})"
                    + (f"; it was at {there[0]} there" if there is not None else "")
                    + ": use a cursor from this artifact's own pages, or start= a position "
                    "this artifact's pages showed"
                )
        if float(fields.get("exp", 0)) < time.time():
            # Signed, so its position is the one this task's reader was given: say it,
            # so that an hour-old cursor on a seven-day artifact does not mean page one.
            raise CursorError(f"cursor has expired; {resume_hint(fields)}")
        return fields


def _secret(home: Path) -> bytes:
    path = home / SECRET_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True)
    # Unique per writer, not per process: threads of one process race here too.
    tmp = home / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(secrets.token_bytes(32))
    try:
        os.link(tmp, path)  # first writer wins; everyone then reads the same key
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    return path.read_bytes()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


_parsed: OrderedDict[str, Any] = OrderedDict()
_parsed_lock = threading.Lock()


def _loaded(data: bytes, digest: str, kind: str) -> Any:
    """The records of a JSON array or NDJSON payload, or a JSON object, else None; parsed
    once per digest (a payload that is none of these is remembered too, or every page
    would parse it)."""
    key = f"{digest}:{kind}"
    with _parsed_lock:
        if key in _parsed:
            _parsed.move_to_end(key)
            return _parsed[key]
    value: Any
    try:
        if kind == "ndjson":
            value = [json.loads(line) for line in data.splitlines() if line.strip()]
        else:
            value = json.loads(data)
            wanted = list if kind == "json_array" else dict
            value = value if isinstance(value, wanted) else None
    except (ValueError, RecursionError):
        value = None
    with _parsed_lock:
        _parsed[key] = value
        while len(_parsed) > _PARSED_CACHE:
            _parsed.popitem(last=False)
    return value


def records_path(
    data: bytes, digest: str, kind: str, asked: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """The path of the records that a JSON object's pages walk: `asked` (which must name
    an array in it), else its largest array of objects; None for any other payload, or an
    object without records (it pages as lines)."""
    if kind != "json_object":
        if asked:
            raise ConfigError(
                f"records path {path_text(asked)!r} is for a JSON object that wraps records; "
                "this artifact is not one: leave records null"
            )
        return None
    value = _loaded(data, digest, kind)
    if not isinstance(value, dict):
        return None
    if asked is None:
        shape = loaded_shape(value)
        found = shape.records if shape is not None else None
        return found.path if found is not None else None
    if not asked or not isinstance(_at(value, asked), list):
        arrays = ", ".join(path_text(facts.path) for facts in arrays_in(value)) or "none"
        raise ConfigError(
            f"records path {path_text(asked)!r} is not an array in this artifact: "
            f"its arrays are {arrays}"
        )
    return asked


def _at(value: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _envelope(value: dict[str, Any], path: tuple[str, ...], count: int) -> dict[str, Any]:
    """The object with the records at path replaced by a short string that says so."""
    said = f"[{count} records at {path_text(path)}: on the pages after this one]"

    def replaced(inner: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
        key, *rest = keys
        return {**inner, key: replaced(inner[key], tuple(rest)) if rest else said}

    return replaced(value, path)


def page(
    data: bytes,
    digest: str,
    kind: str,
    start: Position | None,
    counter: TokenCounter,
    limit: int,
    records: tuple[str, ...] | None = None,
    *,
    units: int | None = None,
    first: int | None = None,
    fields: Sequence[str] | None = None,
    name: str = "",
) -> Page:
    """The page of an artifact that starts at `start` (None: the first page), at most
    `limit` tokens of content; `records` is the path of wrapped records to walk (see
    records_path).

    units: at most this many records or lines (None: as many as fit). first: start at this
    record or line (or byte) instead, counted as the page's positions count it; past the
    end is an error that says the count. fields: cut each record down to these keys (an
    error for a payload that pages as text, or for a key no record has). name: the
    artifact's file name, whose extension says what kind of text it is."""
    budget = max(int(limit * PAGE_SHARE), 16)
    keys = tuple(fields) if fields is not None else None
    if kind == "json_object" and records is not None:
        document = _loaded(data, digest, kind)
        found = _at(document, records)
        if isinstance(found, list):
            envelope = _envelope(document, records, len(found))
            view = _projection(found, keys)
            cut = _wrapped_page(
                envelope, found, start, first, records, counter, budget, units, view
            )
            return replace(cut, fields=keys)
    if kind in ("json_array", "ndjson"):
        loaded = _loaded(data, digest, kind)
        if loaded is not None:
            at = _first(first, len(loaded), "records", start)
            view = _projection(loaded, keys)
            return replace(_record_page(loaded, at, counter, budget, units, view), fields=keys)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        _no_fields(keys, "bytes (base64)")
        return _byte_page(data, _first(first, len(data), "bytes", start), budget, units)
    lines = text.splitlines(keepends=True)
    if kind == "csv" and keys is not None:
        # Columns picked: the rows are records, objects of those columns.
        names, rows, delimiter = _csv_rows(lines)
        at = _first(first, len(rows), "rows", start)
        view = _columns(names, keys, delimiter)
        return replace(_record_page(rows, at, counter, budget, units, view), fields=keys)
    _no_fields(keys, "lines of text")
    at = _first(first, len(lines), "lines", start)
    return _line_page(lines, at, counter, budget, units, text_layout(kind, name, lines))


def _csv_rows(lines: Sequence[str]) -> tuple[list[str], list[str], str]:
    """A CSV's column names, the text of each row after the header (a quoted field may
    hold line breaks), and its delimiter (a tab where the header has as many tabs as
    commas, as the profile tells TSV)."""
    header = _header_lines(lines)
    first = lines[0] if lines else ""
    delimiter = "\t" if first.count("\t") >= max(first.count(","), 1) else ","
    names = next(csv.reader(io.StringIO("".join(lines[:header])), delimiter=delimiter), [])
    rows: list[str] = []
    row: list[str] = []
    odd = False
    for line in lines[header:]:
        row.append(line)
        odd ^= line.count('"') % 2 == 1
        if not odd:
            rows.append("".join(row))
            row = []
    if row:
        rows.append("".join(row))
    return names, rows, delimiter


def _columns(names: list[str], keys: tuple[str, ...], delimiter: str) -> View:
    """The view of a CSV row's text as an object of the columns keys names."""
    _some(keys)
    missing = [key for key in keys if key not in names]
    if missing:
        raise ConfigError(
            f"no column is named {', '.join(missing)}: the columns are {', '.join(names)}"
        )
    where = {key: names.index(key) for key in keys}

    def view(row: str) -> dict[str, str]:
        values = next(csv.reader(io.StringIO(row), delimiter=delimiter), [])
        return {key: values[i] for key, i in where.items() if i < len(values)}

    return view


def _first(first: int | None, total: int, unit: str, start: Position | None) -> Position:
    """The position a page starts at: a reader's record or line, else the cursor's."""
    if first is None:
        return (0, 0) if start is None else start
    if first >= total and not first == total == 0:
        last = f" (start 0 to {total - 1})" if total else ""
        raise ConfigError(f"start {first} is past the end: this artifact has {total} {unit}{last}")
    return (first, 0)


def _no_fields(keys: tuple[str, ...] | None, what: str) -> None:
    if keys is not None:
        raise ConfigError(
            f"fields picks keys of records; this artifact pages as {what}: leave fields null"
        )


View = Callable[[Any], Any]
"""A record as a page shows it: whole, or cut down to the reader's fields."""


def _projection(records: list[Any], keys: tuple[str, ...] | None) -> View:
    """The view of records that keeps only keys (in the reader's order), after checking
    that each key is in some record: a key none has would page as empty records."""
    if keys is None:
        return _whole
    _some(keys)
    missing = dict.fromkeys(keys)
    for record in records:
        if isinstance(record, dict):
            for key in [key for key in missing if key in record]:
                del missing[key]
            if not missing:
                break
    if missing:
        seen: dict[str, None] = {}
        for record in records[:1000]:
            if isinstance(record, dict):
                seen.update(dict.fromkeys(str(key) for key in record))
        known = ", ".join(list(seen)[:40]) or "none (the records are not objects)"
        raise ConfigError(
            f"no record has the key(s) {', '.join(missing)}: the records' keys are {known}"
        )

    def view(record: Any) -> Any:
        if not isinstance(record, dict):
            return record
        return {key: record[key] for key in keys if key in record}

    return view


def _some(keys: tuple[str, ...]) -> None:
    if not keys:
        raise ConfigError("fields is empty: name at least one key, or leave fields null")


def _whole(record: Any) -> Any:
    return record


def _record_page(
    records: Sequence[Any],
    start: Position,
    counter: TokenCounter,
    budget: int,
    units: int | None = None,
    view: View = _whole,
) -> Page:
    index, offset = start
    most = len(records) if units is None else min(len(records), index + units)
    if offset or index >= len(records):
        shown = view(records[index]) if index < len(records) else ""
        encoded = json.dumps(shown, ensure_ascii=False) if index < len(records) else ""
        return _slice_of_one("records", encoded, start, len(records), counter, budget)
    items: list[Any] = []
    used = 0
    while index < most:
        shown = view(records[index])
        encoded = json.dumps(shown, ensure_ascii=False)
        tokens = _tokens_within(counter, encoded, budget - used - 1, escape=False)
        if tokens is None:
            if not items:  # one record alone is over a page: slice it
                return _slice_of_one("records", encoded, start, len(records), counter, budget)
            break
        items.append(shown)
        used += tokens + 1  # and the separator
        index += 1
    return Page("records", start, (index, 0), len(records), items, None, False)


def _wrapped_page(
    envelope: dict[str, Any],
    found: list[Any],
    start: Position | None,
    first: int | None,
    path: tuple[str, ...],
    counter: TokenCounter,
    budget: int,
    units: int | None,
    view: View,
) -> Page:
    """A page of records wrapped in an object: first the envelope (whole, or sliced when
    it is too big for a page), then the records; positions as Position says. A reader's
    `first` goes straight to that record, past the envelope."""
    total = len(found)
    encoded = json.dumps(envelope, ensure_ascii=False)

    def records_from(at: Position, shift: int = 0) -> Page:
        inner = _record_page(found, (at[0], at[1] - shift), counter, budget, units, view)
        return replace(inner, records=path)

    if _tokens_within(counter, encoded, budget, escape=False) is not None:
        if first is None and start is None:
            return Page("envelope", (0, 0), (0, 0), total, None, None, False, path, envelope)
        return records_from(_first(first, total, "records", start))
    length = len(encoded)  # sliced: the envelope's characters come before record 0's
    if first is not None:
        at = _first(first, total, "records", None)
        start = (0, length) if at == (0, 0) else at
    start = (0, 0) if start is None else start
    if start[0] == 0 and start[1] < length:
        cut = _slice_of_one("envelope", encoded, start, 1, counter, budget)
        end = (0, length) if cut.end == (1, 0) else cut.end
        return replace(cut, end=end, total=total, records=path)
    inner = records_from(start, length if start[0] == 0 else 0)
    end = (0, inner.end[1] + length) if inner.end[0] == 0 else inner.end
    return replace(inner, start=start, end=end)


TextLayout = Literal["csv", "markdown", "source", "log", "plain"]
"""What a text's units are, so that its pages end where one ends (see text_layout)."""

_MARKDOWN_EXTENSIONS = frozenset({"md", "markdown", "mdx", "rst"})
_SOURCE_EXTENSIONS = frozenset(
    "py pyi js jsx ts tsx mjs go rs java kt kts scala c h cc cpp hpp cs rb php swift lua "
    "sh bash zsh pl r jl ex exs erl hs ml sql tf proto".split()
)
_HEADING = re.compile(r"#{1,6}(?:\s|$)")
_FENCES = ("```", "~~~")
_DEFINITION = re.compile(
    r"(?:async def|def|class|function|export|import|from \S+ import|fn|pub(?:\(crate\))? "
    r"(?:fn|struct|enum|trait|mod)|func|type|interface|struct|impl|package|module|"
    r"(?:public|private|protected) |#include|@\w)\b"
)
_TIMESTAMP = re.compile(
    r"\[?(?:\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|\d{2}:\d{2}:\d{2}[.,]\d|"
    r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2})"
)
_SNIFF_LINES = 400


def text_layout(kind: str, name: str, lines: Sequence[str]) -> TextLayout:
    """The layout of a text, cheaply: CSV by its shape kind, else by the file's extension,
    else by its first lines (a timestamp that starts the first and others, but not every
    line: a log with continuation lines; code fences or headings: Markdown; top-level
    definitions: source)."""
    if kind == "csv":
        return "csv"
    extension = name.rpartition(".")[2].lower() if "." in name else ""
    if extension in _MARKDOWN_EXTENSIONS:
        return "markdown"
    if extension in _SOURCE_EXTENSIONS:
        return "source"
    if extension == "log":
        return "log"
    head = [line for line in lines[:_SNIFF_LINES] if line.strip()]
    if not head:
        return "plain"
    stamped = sum(1 for line in head if _TIMESTAMP.match(line))
    if _TIMESTAMP.match(head[0]) and 2 <= stamped < len(head):
        return "log"
    fences = sum(1 for line in head if line.startswith(_FENCES))
    headings = sum(1 for line in head if _HEADING.match(line))
    definitions = sum(1 for line in head if _DEFINITION.match(line))
    if fences >= 2 or (headings >= 2 and headings > definitions):
        return "markdown"
    if definitions >= 2:
        return "source"
    return "plain"


def _breaks(
    lines: Sequence[str], layout: TextLayout, begin: int, upto: int
) -> list[Callable[[int], bool]]:
    """Where a page of lines begin..upto may end, best first: each a test of "a page may
    end just before line i", begin < i <= upto. After all of them, any line break."""
    if layout == "log":
        return [lambda i: bool(_TIMESTAMP.match(lines[i]))]
    if layout == "csv":
        # A row ends where the quotes so far are balanced: a quoted field may hold
        # line breaks (RFC 4180's "" escape counts two, keeping the balance).
        before = "".join(lines[:begin]).count('"') % 2 == 1
        quoted = _running(lines, begin, upto, before, lambda line: line.count('"') % 2 == 1)
        return [lambda i: not quoted[i - begin]]
    if layout == "markdown":
        # Joined with a break of its own before each line, so "\n```" counts exactly
        # the lines that open or close a fence, whatever break (\r, \u2028) ended the
        # line before; counted in C, for a page deep in a long document.
        joined = "\n" + "\n".join(lines[:begin])
        before = sum(joined.count("\n" + fence) for fence in _FENCES) % 2 == 1
        fenced = _running(lines, begin, upto, before, lambda line: line.startswith(_FENCES))
        return [
            lambda i: not fenced[i - begin] and bool(_HEADING.match(lines[i])),
            lambda i: not fenced[i - begin] and not lines[i - 1].strip() and bool(lines[i].strip()),
        ]
    if layout == "source":

        def top_level(i: int) -> bool:
            """A block at the left margin after a blank line: a definition, its decorators
            or comment, a top-level statement; not the closing bracket of one."""
            return not lines[i - 1].strip() and lines[i][0] not in " \t\r\n)]}"

        return [top_level, lambda i: not lines[i - 1].strip()]
    return []


def _running(
    lines: Sequence[str], begin: int, upto: int, before: bool, flips: Callable[[str], bool]
) -> list[bool]:
    """A state carried line by line, that a line may flip (a quote left open, a code
    fence): its value after each line from begin - 1 (`before`, counted from the top by
    the caller, at C speed) to upto - 1, indexed from 0."""
    states = [before]
    for line in lines[begin:upto]:
        states.append(states[-1] ^ flips(line))
    return states


def _header_lines(lines: Sequence[str]) -> int:
    """How many lines a CSV's header takes (more than one where a quoted name holds a
    line break)."""
    odd = False
    for i, line in enumerate(lines):
        odd ^= line.count('"') % 2 == 1
        if not odd:
            return i + 1
    return len(lines)


def _line_page(
    lines: list[str],
    start: Position,
    counter: TokenCounter,
    budget: int,
    units: int | None = None,
    layout: TextLayout = "plain",
) -> Page:
    index, offset = start
    if offset or index >= len(lines):
        line = lines[index] if index < len(lines) else ""
        return _slice_of_one("lines", line, start, len(lines), counter, budget)
    header = _header_lines(lines) if layout == "csv" else 0
    repeated = "".join(lines[:header]) if 0 < header <= index else ""
    room = budget
    if repeated:
        cost = _tokens_within(counter, repeated, budget // 2, escape=True)
        # A header that would take half the page is not repeated: the rows matter more.
        repeated, room = ("", budget) if cost is None else (repeated, budget - cost)
    most = len(lines) if units is None else min(len(lines), index + units)
    taken: list[str] = []
    used = 0
    while index < most:
        tokens = _tokens_within(counter, lines[index], room - used, escape=True)
        if tokens is None:
            if not taken:
                return _slice_of_one("lines", lines[index], start, len(lines), counter, budget)
            break
        taken.append(lines[index])
        used += tokens
        index += 1
    end = _unit_end(lines, start[0], index, layout)
    text = repeated + "".join(taken[: end - start[0]])
    return Page(
        "lines", start, (end, 0), len(lines), None, text, False, header=header if repeated else 0
    )


def _unit_end(lines: Sequence[str], begin: int, end: int, layout: TextLayout) -> int:
    """Where a page of lines begin..end ends so as to keep the text's units whole: the
    last place within it where the best kind of boundary lies, else end (a line break)."""
    if end >= len(lines):
        return end
    for may_end in _breaks(lines, layout, begin, end):
        for i in range(end, begin, -1):
            if may_end(i):
                return i
    return end


def _slice_of_one(
    unit: str, whole: str, start: Position, total: int, counter: TokenCounter, budget: int
) -> Page:
    """A character slice of one record or line, from start's offset, within budget."""
    index, offset = start
    if index >= total:
        return Page(unit, start, start, total, [] if unit == "records" else None, "", False)
    rest = len(whole) - offset

    def fits(size: int) -> bool:
        # Counted as the model sees it: JSON-escaped (quotes, backslashes and control
        # characters cost more escaped than raw).
        return counter.count(_as_json(whole[offset : offset + size])) <= budget

    # The longest slice that fits: double from a few characters a token until one is
    # over, then bisect to within 2 %. Counting stays proportional to the page, never
    # to the whole line, and the page is close to the budget, not a lucky fraction of it.
    good, over = 0, min(rest, budget * _CHARS_PER_TOKEN_GUESS)
    while fits(over):
        good = over
        if over == rest:
            break
        over = min(rest, over * 2)
    if good < rest:
        while over - good > max(good // 64, 1):
            middle = (good + over) // 2
            good, over = (middle, over) if fits(middle) else (good, middle)
    end_offset = offset + max(good, 1)  # one character always fits: budget is at least 16
    end: Position = (index + 1, 0) if end_offset >= len(whole) else (index, end_offset)
    return Page(unit, start, end, total, None, whole[offset:end_offset], True)


def _tokens_within(counter: TokenCounter, text: str, limit: int, escape: bool) -> int | None:
    """The tokens of text as the model sees it (JSON-escaped if escape), or None if over
    limit; in time bounded by limit, not by the length of a huge line or record."""
    head = text[: max(limit, 1) * counter.max_token_chars + 1]
    fits, tokens = count_within(counter, _as_json(head) if escape else head, max(limit, 0))
    return tokens if fits and len(head) == len(text) else None


def _as_json(text: str) -> str:
    """Text as it appears inside read_artifact's JSON result, where its tokens count."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _byte_page(data: bytes, start: Position, budget: int, units: int | None = None) -> Page:
    # Base64 runs about 1.5-3 characters a token and 4 characters per 3 bytes: half the
    # budget in bytes stays well under it.
    size = budget // 2 if units is None else min(budget // 2, units)
    index = start[0]
    chunk = data[index : index + size]
    text = base64.b64encode(chunk).decode("ascii")
    return Page("bytes", start, (index + len(chunk), 0), len(data), None, text, False)
