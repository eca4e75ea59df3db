"""How much memory the proxy's upstream reader takes for a large result, and what it reads.

The bound is a size, not a time: a process reads one large tools/call result from a real
upstream subprocess through spillbox.mcp.transport and reports its own peak RSS growth
(VmHWM, reset through /proc/self/clear_refs just before), which must stay near the two
copies parsing needs (the line's text and the parsed string; the old reader, which joined
chunks and let pydantic parse the union, took about 6x).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import anyio
import mcp_types as types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from spillbox.mcp import spool as spool_module
from spillbox.mcp import transport
from spillbox.mcp.spool import Spool, shrink
from spillbox.mcp.transport import _message, _StreamLines

PAYLOAD_MB = 48
MAX_GROWTH = 2.5
"""Peak RSS growth over the payload while one result is read and parsed (the floor is 2)."""
MAX_SPOOLED_GROWTH = 1.3
"""The same, its text spooled (spillbox.mcp.spool): the line, then the text's bytes."""

PIECE = '0123456789 "quoted" and a line\n' * 32
"""What the upstream's text repeats: JSON escapes in it, as in most real results."""

WRITER = """
import json, sys
piece = json.dumps(sys.argv[1])[1:-1].encode()
out = sys.stdout.buffer
out.write(b'{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"')
for _ in range(int(sys.argv[2])):
    out.write(piece)
out.write(b'"}]}}\\n')
out.flush()
sys.stdin.read()
"""

READER = """
import anyio, hashlib, json, os, sys
from pathlib import Path
import mcp_types as types
from spillbox.mcp.spool import Spool
from spillbox.mcp.transport import upstream_stdio

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

async def main():
    spool = Spool() if sys.argv[1] == "spool" else None
    command = [sys.executable, "-c", *sys.argv[2:]]
    async with upstream_stdio(command, os.environ, spool=spool) as (read, _):
        before = status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        item = await read.receive()
        result = types.CallToolResult.model_validate(item.message.result)
        data = result.content[0].text.encode() if spool is None else spool.payload(result)
        peak = status("VmHWM")
        print(json.dumps({"growth": peak - before, "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()}))

anyio.run(main)
"""


def _expected(repeats: int) -> str:
    """The sha256 of the writer's text, hashed piece by piece (no copy of it held here)."""
    digest = hashlib.sha256()
    for _ in range(repeats):
        digest.update(PIECE.encode())
    return digest.hexdigest()


@pytest.mark.parametrize(("spooled", "bound"), [(False, MAX_GROWTH), (True, MAX_SPOOLED_GROWTH)])
def test_a_large_result_is_read_and_parsed_holding_it_at_most_about_twice(
    spooled: bool, bound: float
) -> None:
    """Parsed as the SDK parses it: the line's text and the parsed string at once. With a
    spool (the proxy's reader): the text unescaped in the line's own buffer, held once."""
    repeats = PAYLOAD_MB * 2**20 // len(PIECE)
    size = repeats * len(PIECE)
    how = "spool" if spooled else "parse"
    done = subprocess.run(
        [sys.executable, "-c", READER, how, WRITER, PIECE, str(repeats)],
        capture_output=True,
        text=True,
        timeout=600,  # load room: the writer and reader share the cores with other workers
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["bytes"], report["sha256"]) == (size, _expected(repeats)), "not read exactly"
    growth = report["growth"] / size
    assert growth <= bound, (
        f"reading one {PAYLOAD_MB} MB result ({how}) grew the reader's peak RSS by "
        f"{growth:.2f}x its size (at most {bound}x)"
    )


class _Chunks:
    """A byte stream that gives the chunks it was made with, then ends."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.chunks:
            raise anyio.EndOfStream
        return self.chunks.pop(0)


async def _read(chunks: list[bytes]) -> list[bytes]:
    return [bytes(line) async for line in _StreamLines(_Chunks(chunks))]  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_lines_are_read_exactly_across_chunk_boundaries() -> None:
    chunks = [b"one", b"\ntw", b"o\n\nthree\nfo", b"", b"ur", b"\n", b"cut off at the end"]
    assert await _read(chunks) == [b"one", b"two", b"", b"three", b"four"]


@pytest.mark.anyio
async def test_many_lines_in_one_chunk_are_each_read_once() -> None:
    lines = [f'{{"n": {n}}}'.encode() for n in range(5000)]
    assert await _read([b"\n".join(lines) + b"\n"]) == lines


def _response(text_json: str) -> bytearray:
    return bytearray(b'{"jsonrpc":"2.0","id":1,"result":{"t":' + text_json.encode() + b"}}")


def test_a_lone_surrogate_is_refused_as_the_sdk_refuses_it_and_a_pair_is_read() -> None:
    with pytest.raises(ValueError):
        _message(_response('"a\\ud800b"'))
    with pytest.raises(ValueError):
        _message(_response('"a\\uDC00"'))
    paired = _message(_response('"a\\ud83d\\ude00 \\"b\\"\\n"'))
    assert paired.result == {"t": 'a\U0001f600 "b"\n'}  # type: ignore[union-attr]


def test_a_line_that_is_not_json_or_not_utf8_is_a_value_error() -> None:
    for line in (b"not json", b'{"jsonrpc":"2.0","id":1,"result":{"t":"\xff"}}', b'{"id":1}'):
        with pytest.raises(ValueError):
            _message(bytearray(line))


def test_the_line_is_emptied_once_parsed() -> None:
    line = _response(json.dumps("x" * 1000))
    assert _message(line).result == {"t": "x" * 1000}  # type: ignore[union-attr]
    assert line == bytearray()


class _AnyJson(BaseModel):
    """Any JSON object, as a model (Spool.settle takes models)."""

    model_config = ConfigDict(extra="allow")


_SPOOLED_CHARS = 'ab "\\\n\t/u\x01\u2028é中😀'


@settings(max_examples=300, deadline=None)
@given(
    # Short (as they are), about the threshold, and long: every cut a chunk can meet.
    text=st.text(_SPOOLED_CHARS, max_size=40) | st.text(_SPOOLED_CHARS, min_size=150, max_size=900),
    other=st.text('a"\\é', max_size=40) | st.text('a"\\é', min_size=150, max_size=400),
    ascii_only=st.booleans(),
)
def test_long_strings_are_spooled_exactly(text: str, other: str, ascii_only: bool) -> None:
    """Every string of SPOOL_MIN_BYTES or more comes out of the line as its exact UTF-8,
    read in chunks cut anywhere but inside an escape or a character (small sizes here, so
    that every kind of cut is met); shorter ones stay in the line as they were."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(spool_module, "SPOOL_MIN_BYTES", 300)
        patched.setattr(spool_module, "_CHUNK_MIN", 7)
        patched.setattr(spool_module, "_CHUNK_MAX", 64)
        _spooled_exactly(text, other, ascii_only)


def _spooled_exactly(text: str, other: str, ascii_only: bool) -> None:
    sent = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": text}]}}
    sent["result"]['k\\"ey'] = other  # a key with escapes, beside the long text
    sent["result"][other + "?"] = [1]  # a key as long as any string
    # \\ud83d-style escapes of an emoji take the SDK's parser (_message): not spooled.
    raw = json.dumps(sent, ensure_ascii=ascii_only and text.isascii()).encode()

    spool, line = Spool(), bytearray(raw)
    shrink(line, spool)
    shrunk = json.loads(line)
    long = len(text.encode()) >= 300
    assert (shrunk["result"]["content"][0]["text"] != text) == long
    assert len(spool) == sum(len(s.encode()) >= 300 for s in (text, other, other + "?"))
    assert spool.settle(_AnyJson.model_validate(shrunk)).model_dump() == sent
    assert len(spool) == 0

    spool, line = Spool(), bytearray(raw)
    shrink(line, spool)
    result = types.CallToolResult.model_validate({"content": json.loads(line)["result"]["content"]})
    assert spool.payload(result) == (text.encode() if long else None)


def test_a_long_message_that_is_not_a_response_keeps_its_strings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server's request or notification is not gated: its long strings, spooled while
    the line was read, are back in it as str before anyone sees it."""
    monkeypatch.setattr(transport, "SPOOL_LINE_BYTES", 10)
    monkeypatch.setattr(spool_module, "SPOOL_MIN_BYTES", 20)
    text = "x\n" * 50
    request = {"jsonrpc": "2.0", "id": 3, "method": "sampling/createMessage", "params": {"t": text}}
    spool = Spool()
    message = _message(bytearray(json.dumps(request).encode()), spool)
    assert isinstance(message, types.JSONRPCRequest) and message.params == {"t": text}
    assert len(spool) == 0
    answer = {"jsonrpc": "2.0", "id": 3, "result": {"t": text}}
    response = _message(bytearray(json.dumps(answer).encode()), spool)
    assert isinstance(response, types.JSONRPCResponse) and response.result["t"] != text
    assert len(spool) == 1


def test_a_long_line_is_parsed_as_it_is_where_no_temporary_file_can_be_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused() -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transport, "SPOOL_LINE_BYTES", 10)
    monkeypatch.setattr(spool_module, "SPOOL_MIN_BYTES", 20)
    monkeypatch.setattr(spool_module.tempfile, "TemporaryFile", refused)
    text = "x\n" * 50
    spool = Spool()
    answer = {"jsonrpc": "2.0", "id": 3, "result": {"t": text}}
    response = _message(bytearray(json.dumps(answer).encode()), spool)
    assert isinstance(response, types.JSONRPCResponse) and response.result == {"t": text}
    assert len(spool) == 0


def test_a_line_of_many_short_strings_is_walked_only_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Records as structuredContent are a million short strings: the reader stops looking
    for long ones after _STRINGS_MAX of them, so that such a line costs no more to read
    than it did; a long text before them is still spooled."""
    monkeypatch.setattr(spool_module, "SPOOL_MIN_BYTES", 100)
    monkeypatch.setattr(spool_module, "_STRINGS_MAX", 50)
    rows = [{"id": i, "name": f"n{i}"} for i in range(100)]
    text, late = "t" * 200, "l" * 200
    answer = {"content": [{"type": "text", "text": text}], "rows": rows, "late": late}
    line = bytearray(json.dumps({"jsonrpc": "2.0", "id": 1, "result": answer}).encode())
    spool = Spool()
    shrink(line, spool)
    shrunk = json.loads(line)["result"]
    assert shrunk["content"][0]["text"] != text and len(spool) == 1
    assert (shrunk["rows"], shrunk["late"]) == (rows, late)  # past the budget: as they were


def test_a_spooled_string_no_one_takes_is_dropped_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer that came after its request gave up is never taken: its bytes go once
    ABANDONED_SECONDS have passed, at the next keep."""
    now = [1000.0]
    monkeypatch.setattr(spool_module.time, "monotonic", lambda: now[0])
    spool, mark = Spool(), "spillbox-spooled:"
    spool.keep(mark + "a", b"abandoned")
    now[0] += spool_module.ABANDONED_SECONDS / 2
    spool.keep(mark + "b", b"taken")
    now[0] += spool_module.ABANDONED_SECONDS / 2 + 1
    spool.keep(mark + "c", b"new")
    assert len(spool) == 2
    assert spool.settle({"x": [mark + "a", mark + "b"], "y": mark + "c"}) == {
        "x": [mark + "a", "taken"],
        "y": "new",
    }
