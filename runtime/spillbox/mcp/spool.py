"""An upstream's long strings moved out of its answer as bytes, never decoded whole.

A tools/call result of 100 MB arrives as one JSON-RPC line. Parsed as the SDK parses it,
its text exists twice at some moment: the line and the str parsed from it, then that str
and the bytes the gate stores (2x the payload). Here, in a response's line of
SPOOL_LINE_BYTES or more, each string of SPOOL_MIN_BYTES or more is unescaped in place,
in the line's own buffer, written to an unnamed temporary file, and cut out of the line
around a placeholder; the SDK parses the small line that is left, and the string's UTF-8
is read back from the file once the line is small: held once.

    spool = Spool()
    shrink(line, spool)                  # the reader, before it parses the line
    with spool.spooling():               # the caller that gates a tools/call whole
        result = await session.call_tool(...)
    data = spool.payload(result)         # its one text block's bytes, or None
    result = spool.settle(result)        # every other answer: placeholders back to str

Only a caller inside spooling() gets placeholders: any other answer (resources/read,
prompts/get, a request's result the proxy passes on) is settled by the session before it
is returned (SpoolingSession), so no placeholder ever reaches a client.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import mcp_types as types
from mcp.client.session import ClientSession
from pydantic import BaseModel

SPOOL_LINE_BYTES = 4 << 20
"""A line shorter than this is parsed as it is."""
SPOOL_MIN_BYTES = 1 << 20
"""A string of a response this long (unescaped) is spooled."""
_CHUNK_MIN = 256
_CHUNK_MAX = 1 << 20
"""A string with escapes is unescaped a chunk at a time, from 256 bytes up to 1 MB."""
_STRINGS_MAX = 10_000
"""Strings looked at in one line at most: a tool result's text comes first (content, then
structuredContent); a line of a million short strings (records as structuredContent) is
left to the parser after these, at a few ms."""
ABANDONED_SECONDS = 600.0
"""A spooled string no one took this long after its answer came is dropped."""
_ESCAPE_MAX = 6
"""The longest JSON escape (\\uXXXX)."""
_BACKSLASH = 0x5C
_MARK = "spillbox-spooled:"
"""A placeholder's start; 32 random hex digits follow (no server can guess one)."""
_scanstring: Callable[[str, int, bool], tuple[str, int]]
_scanstring = json.decoder.scanstring  # type: ignore[attr-defined]  # not in typeshed
"""The stdlib's JSON string reader (C): from the character after a string's opening
quote to its closing one, escapes unescaped."""
_SPOOLING: ContextVar[bool] = ContextVar("spillbox_spooling", default=False)

T = TypeVar("T")


class Spool:
    """The spooled strings of one upstream connection, by placeholder, until taken."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[float, bytes]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, placeholder: str, data: bytes) -> None:
        """Keep data under placeholder; drop what was kept ABANDONED_SECONDS ago (an answer
        that came after its request gave up: nothing will take it)."""
        now = time.monotonic()
        for old in [p for p, (at, _) in self._kept.items() if now - at > ABANDONED_SECONDS]:
            del self._kept[old]
        self._kept[placeholder] = (now, data)

    def _take(self, placeholder: str) -> bytes | None:
        kept = self._kept.pop(placeholder, None) if placeholder.startswith(_MARK) else None
        return None if kept is None else kept[1]

    @staticmethod
    @contextmanager
    def spooling() -> Iterator[None]:
        """Answers to requests sent inside this block keep their placeholders."""
        token = _SPOOLING.set(True)
        try:
            yield
        finally:
            _SPOOLING.reset(token)

    def payload(self, result: types.CallToolResult) -> bytes | None:
        """The bytes of a result that is one spooled text block and nothing else the gate
        counts (spillbox.mcp.results.counted: then the text is the whole of it)."""
        [block] = result.content if len(result.content) == 1 else [None]
        if (
            not isinstance(block, types.TextContent)
            or result.structured_content is not None
            or result.meta
        ):
            return None
        return self._take(block.text)

    def settle(self, value: T) -> T:
        """value (a model, or JSON's dicts and lists) with each placeholder in it back as
        the str it stands for."""
        if not self._kept:
            return value
        if isinstance(value, BaseModel):
            dumped = value.model_dump(by_alias=True, exclude_unset=True)
            settled: T = type(value).model_validate(self._settled(dumped), by_name=False)
            return settled
        return self._settled(value)  # type: ignore[no-any-return]

    def _settled(self, value: Any) -> Any:
        if isinstance(value, str):
            data = self._take(value)
            return value if data is None else data.decode("utf-8")
        if isinstance(value, dict):  # a key too: JSON's keys are strings as long as any
            return {self._settled(key): self._settled(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._settled(item) for item in value]
        return value


class SpoolingSession(ClientSession):
    """A ClientSession whose answers come back settled (Spool.settle) but inside
    Spool.spooling()."""

    spool: Spool

    async def send_request(self, *args: Any, **kwargs: Any) -> Any:
        result = await super().send_request(*args, **kwargs)
        return result if _SPOOLING.get() else self.spool.settle(result)


def shrink(line: bytearray, spool: Spool) -> None:
    """Move each string of SPOOL_MIN_BYTES or more out of line, in place, into spool,
    leaving its placeholder (a JSON string) where it stood. ValueError if a string in
    line is not valid JSON (the line then is not a message), or if the temporary file
    fails once line has changed; OSError, line as it was, if none can be made."""
    kept: list[tuple[str, int]] = []
    with tempfile.TemporaryFile() as file:
        at = walked = 0
        while walked < _STRINGS_MAX and (quote := line.find(b'"', at)) >= 0:
            walked += 1
            start = quote + 1
            close = line.find(b'"', start)
            if 0 <= close < start + SPOOL_MIN_BYTES and line.find(b"\\", start, close) < 0:
                at = close + 1  # short, and no escape in it: as it is
                continue
            end, close = _unescaped(line, start)
            if end is None:
                at = close + 1
                continue
            placeholder = _MARK + secrets.token_hex(16)
            try:
                with memoryview(line) as view:
                    file.write(view[start:end])
            except OSError as e:
                raise ValueError(f"a long string of the upstream's answer was lost: {e}") from e
            kept.append((placeholder, end - start))
            literal = json.dumps(placeholder).encode()
            line[quote : close + 1] = literal
            at = quote + len(literal)
        file.seek(0)
        for placeholder, size in kept:  # the line is small now: each read back whole
            spool.keep(placeholder, file.read(size))


def _unescaped(line: bytearray, start: int) -> tuple[int | None, int]:
    """The JSON string whose characters start at start: (where its UTF-8, written over
    it in place, ends; None if it is shorter than SPOOL_MIN_BYTES, left as it is), and
    where its closing quote stands."""
    held: list[bytes] | None = []
    """Its UTF-8 so far, while it is short."""
    size, read, written, count = _CHUNK_MIN, start, start, 0
    while True:
        cut = _cut(line, read, size)
        if cut is None:
            size *= 2  # a run of backslashes longer than the chunk
            continue
        with memoryview(line) as view:
            piece = str(view[read:cut], "utf-8")
        value, stop = _scanstring(piece + '"', 0, True)
        closed = stop <= len(piece)
        data = value.encode("utf-8")
        count += len(data)
        if held is not None:
            held.append(data)
            if count >= SPOOL_MIN_BYTES:  # long: what is held goes in place, then the rest
                for part in held:
                    line[written : written + len(part)] = part
                    written += len(part)
                held = None
        else:
            line[written : written + len(data)] = data
            written += len(data)
        if closed:
            close = read + len(piece[: stop - 1].encode("utf-8"))
            return (None if held is not None else written), close
        if cut >= len(line):
            raise ValueError("Unterminated string in the upstream's line")
        read, size = cut, min(2 * size, _CHUNK_MAX)


def _cut(line: bytearray, start: int, size: int) -> int | None:
    """Where a chunk of line from start, about size bytes, may end: not inside a UTF-8
    sequence or an escape; the line's end if it is nearer; None if no such place."""
    cut = start + size
    if cut >= len(line):
        return len(line)
    while cut > start and 0x80 <= line[cut] < 0xC0:
        cut -= 1
    escape = line.rfind(b"\\", max(start, cut - _ESCAPE_MAX + 1), cut)
    if escape >= 0:  # back to the start of its run of backslashes: an escape starts there
        cut = backslashes_from(line, escape, start)
    return cut if cut > start else None


def backslashes_from(line: bytearray, at: int, floor: int = 0) -> int:
    """Where the run of backslashes just before at (not before floor) starts; at if none."""
    while at > floor and line[at - 1] == _BACKSLASH:
        at -= 1
    return at
