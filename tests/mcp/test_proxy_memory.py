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
import pytest

from spillbox.mcp.transport import _message, _StreamLines

PAYLOAD_MB = 48
MAX_GROWTH = 2.5
"""Peak RSS growth over the payload while one result is read and parsed (the floor is 2)."""

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
from spillbox.mcp.transport import upstream_stdio

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

async def main():
    async with upstream_stdio([sys.executable, "-c", *sys.argv[1:]], os.environ) as (read, _):
        before = status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        item = await read.receive()
        peak = status("VmHWM")
        text = item.message.result["content"][0]["text"]
        print(json.dumps({"growth": peak - before, "bytes": len(text.encode()),
                          "sha256": hashlib.sha256(text.encode()).hexdigest()}))

anyio.run(main)
"""


def _expected(repeats: int) -> str:
    """The sha256 of the writer's text, hashed piece by piece (no copy of it held here)."""
    digest = hashlib.sha256()
    for _ in range(repeats):
        digest.update(PIECE.encode())
    return digest.hexdigest()


def test_a_large_result_is_read_and_parsed_holding_it_at_most_about_twice() -> None:
    repeats = PAYLOAD_MB * 2**20 // len(PIECE)
    size = repeats * len(PIECE)
    done = subprocess.run(
        [sys.executable, "-c", READER, WRITER, PIECE, str(repeats)],
        capture_output=True,
        text=True,
        timeout=600,  # load room: the writer and reader share the cores with other workers
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["bytes"], report["sha256"]) == (size, _expected(repeats)), "not read exactly"
    growth = report["growth"] / size
    assert growth <= MAX_GROWTH, (
        f"reading one {PAYLOAD_MB} MB result grew the reader's peak RSS by {growth:.2f}x its "
        f"size (at most {MAX_GROWTH}x: the line's text and the parsed string, held together)"
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
