"""Reading an artifact back a page at a time, at natural boundaries, under the gate.

A page holds whole records (JSON array elements, NDJSON lines, or the elements of an
array inside a JSON object, after a page for the rest of the object: its envelope), whole
text lines, or a run of bytes; one record or line too big for a page is itself cut into
character slices, so even a 40 MB one-line JSON pages. Each page stays under the per-call
threshold, so reading back never triggers an offload of the offload.

Cursors are opaque to the model: a versioned payload signed with HMAC-SHA256 under a
secret kept in the spillbox home, so a tampered, expired or foreign cursor (another
task, another artifact, another home) is refused with a clear error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from spillbox.errors import ConfigError
from spillbox.profile import arrays_in, loaded_shape, path_text
from spillbox.tokens import TokenCounter, count_within

CURSOR_VERSION = 1
CURSOR_TTL_SECONDS = 3600.0
SECRET_FILE = "cursor.key"
PAGE_SHARE = 0.8
"""A page uses at most this share of the per-call threshold; the envelope needs the rest."""
_PARSED_CACHE = 4
_CHARS_PER_TOKEN_GUESS = 4
"""Where the search for a slice's length starts; it doubles or bisects from there."""

Position = tuple[int, int]
"""(record or line or byte index, character offset inside that record or line).

For records wrapped in an object, the envelope comes before record 0 and holds none of
the records: its page is at (0, 0) to (0, 0). An envelope too big for one page is sliced
at (0, k) to (0, k'), k counting characters of its JSON; its last slice ends at (0, L), L
its length, where the records start, so a slice of record 0 is then at (0, L + k)."""


class CursorError(ConfigError):
    """A cursor that cannot be used: tampered, expired, or made for something else."""


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

    @property
    def has_more(self) -> bool:
        return self.end[0] < self.total


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
            raise CursorError(
                "cursor is not valid here (tampered, or made by another spillbox home): "
                "start again without a cursor"
            )
        fields: dict[str, Any] = json.loads(raw)
        if fields.get("v") != CURSOR_VERSION:
            raise CursorError(
                f"cursor version {fields.get('v')} is not supported: start again without a cursor"
            )
        if float(fields.get("exp", 0)) < time.time():
            raise CursorError("cursor has expired: start again without a cursor")
        for key, value in expect.items():
            if fields.get(key) != value:
                raise CursorError(
                    f"cursor belongs to another {key} ({fields.get(key)!r}, not {value!r}): "
                    "use a cursor from this artifact's own pages"
                )
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
) -> Page:
    """The page of an artifact that starts at `start` (None: the first page), at most
    `limit` tokens of content; `records` is the path of wrapped records to walk (see
    records_path)."""
    budget = max(int(limit * PAGE_SHARE), 16)
    if kind == "json_object" and records is not None:
        document = _loaded(data, digest, kind)
        found = _at(document, records)
        if isinstance(found, list):
            envelope = _envelope(document, records, len(found))
            return _wrapped_page(envelope, found, start, records, counter, budget)
    start = (0, 0) if start is None else start
    if kind in ("json_array", "ndjson"):
        loaded = _loaded(data, digest, kind)
        if loaded is not None:
            return _record_page(loaded, start, counter, budget)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _byte_page(data, start, budget)
    return _line_page(text.splitlines(keepends=True), start, counter, budget)


def _record_page(records: list[Any], start: Position, counter: TokenCounter, budget: int) -> Page:
    index, offset = start
    if offset or index >= len(records):
        encoded = json.dumps(records[index], ensure_ascii=False) if index < len(records) else ""
        return _slice_of_one("records", encoded, start, len(records), counter, budget)
    items: list[Any] = []
    used = 0
    while index < len(records):
        encoded = json.dumps(records[index], ensure_ascii=False)
        tokens = _tokens_within(counter, encoded, budget - used - 1, escape=False)
        if tokens is None:
            if not items:  # one record alone is over a page: slice it
                return _slice_of_one("records", encoded, start, len(records), counter, budget)
            break
        items.append(records[index])
        used += tokens + 1  # and the separator
        index += 1
    return Page("records", start, (index, 0), len(records), items, None, False)


def _wrapped_page(
    envelope: dict[str, Any],
    found: list[Any],
    start: Position | None,
    path: tuple[str, ...],
    counter: TokenCounter,
    budget: int,
) -> Page:
    """A page of records wrapped in an object: first the envelope (whole, or sliced when
    it is too big for a page), then the records; positions as Position says."""
    total = len(found)
    encoded = json.dumps(envelope, ensure_ascii=False)
    if _tokens_within(counter, encoded, budget, escape=False) is not None:
        if start is None:
            return Page("envelope", (0, 0), (0, 0), total, None, None, False, path, envelope)
        return replace(_record_page(found, start, counter, budget), records=path)
    length = len(encoded)  # sliced: the envelope's characters come before record 0's
    start = (0, 0) if start is None else start
    if start[0] == 0 and start[1] < length:
        cut = _slice_of_one("envelope", encoded, start, 1, counter, budget)
        end = (0, length) if cut.end == (1, 0) else cut.end
        return replace(cut, end=end, total=total, records=path)
    shift = length if start[0] == 0 else 0
    inner = _record_page(found, (start[0], start[1] - shift), counter, budget)
    end = (0, inner.end[1] + length) if inner.end[0] == 0 else inner.end
    return replace(inner, start=start, end=end, records=path)


def _line_page(lines: list[str], start: Position, counter: TokenCounter, budget: int) -> Page:
    index, offset = start
    if offset or index >= len(lines):
        line = lines[index] if index < len(lines) else ""
        return _slice_of_one("lines", line, start, len(lines), counter, budget)
    taken: list[str] = []
    used = 0
    while index < len(lines):
        tokens = _tokens_within(counter, lines[index], budget - used, escape=True)
        if tokens is None:
            if not taken:
                return _slice_of_one("lines", lines[index], start, len(lines), counter, budget)
            break
        taken.append(lines[index])
        used += tokens
        index += 1
    return Page("lines", start, (index, 0), len(lines), None, "".join(taken), False)


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


def _byte_page(data: bytes, start: Position, budget: int) -> Page:
    # Base64 runs about 1.5-3 characters a token and 4 characters per 3 bytes: half the
    # budget in bytes stays well under it.
    size = budget // 2
    index = start[0]
    chunk = data[index : index + size]
    text = base64.b64encode(chunk).decode("ascii")
    return Page("bytes", start, (index + len(chunk), 0), len(data), None, text, False)
