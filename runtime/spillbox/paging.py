"""Reading an artifact back a page at a time, at natural boundaries, under the gate.

A page holds whole records (JSON array elements, NDJSON lines), whole text lines, or a
run of bytes; one record or line too big for a page is itself cut into character
slices, so even a 40 MB one-line JSON pages. Each page stays under the per-call
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spillbox.errors import ConfigError
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
"""(record or line or byte index, character offset inside that record or line)."""


class CursorError(ConfigError):
    """A cursor that cannot be used: tampered, expired, or made for something else."""


@dataclass(frozen=True)
class Page:
    """One slice of an artifact, as read_artifact returns it."""

    unit: str
    """"records", "lines" or "bytes"."""
    start: Position
    end: Position
    total: int
    items: list[Any] | None
    text: str | None
    partial: bool
    """True if this page is a slice of one record or line too big for a page."""

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


_parsed: OrderedDict[str, list[Any] | None] = OrderedDict()
_parsed_lock = threading.Lock()


def _records(data: bytes, digest: str, kind: str) -> list[Any] | None:
    """The records of a JSON array or NDJSON payload, else None; parsed once per digest
    (a payload that is not records is remembered too, or every page would parse it)."""
    key = f"{digest}:{kind}"
    with _parsed_lock:
        if key in _parsed:
            _parsed.move_to_end(key)
            return _parsed[key]
    records: list[Any] | None
    try:
        if kind == "json_array":
            value = json.loads(data)
            records = value if isinstance(value, list) else None
        else:
            records = [json.loads(line) for line in data.splitlines() if line.strip()]
    except ValueError:
        records = None
    with _parsed_lock:
        _parsed[key] = records
        while len(_parsed) > _PARSED_CACHE:
            _parsed.popitem(last=False)
    return records


def page(
    data: bytes, digest: str, kind: str, start: Position, counter: TokenCounter, limit: int
) -> Page:
    """The page of an artifact that starts at `start`, at most `limit` tokens of content."""
    budget = max(int(limit * PAGE_SHARE), 16)
    if kind in ("json_array", "ndjson"):
        records = _records(data, digest, kind)
        if records is not None:
            return _record_page(records, start, counter, budget)
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
