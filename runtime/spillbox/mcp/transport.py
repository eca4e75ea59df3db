"""MCP over stdio: this process's stdin and stdout for the client, and the upstream
server's pipes.

    async with stdio() as (read, write):                 # the client side
        await server.run(read, write, options)
    async with upstream_stdio(command, env) as (read, write):   # the upstream side
        async with ClientSession(read, write) as session: ...

The client side is the SDK's stdio server, where a line that is not a JSON-RPC message,
or a request with an id JSON-RPC does not allow (spillbox.mcp.ids), gets a JSON-RPC error
(id null), as JSON-RPC asks, instead of being dropped in silence.
The SDK's server reads and writes the process's stdin and stdout through worker threads,
three thread hops per request and answer; where they are pipes, sockets or terminals (as
every MCP client gives them), it is given them here as the event loop's own pipes instead,
which took about 0.4 ms off each call (benchmarks/mcp_bench.py). As the SDK does, fds 0
and 1 then point at /dev/null and stderr while serving, so that stray output of anything
in the process misses the wire.

The upstream side is the SDK's stdio client but for how it reads a line: mcp 2.3.0's
joins its whole buffer to each 64 KB chunk and splits it again, time quadratic in the
line's length (a 100 MB result took its reader over a minute and a half of CPU), so the
result spillbox exists for would stall it. Lines are read here in linear time, each
held in one buffer and parsed by the stdlib's json (see _message); the process is
started and stopped as the SDK does (its own session, stdin closed, then the SDK's
terminate_posix_process_tree).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, MutableSequence, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import ReadStream, WriteStream
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from spillbox.mcp import ids
from spillbox.mcp.spool import SPOOL_LINE_BYTES, Spool, backslashes_from, shrink

Streams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]

LINE_LIMIT = 2**31
"""The longest line read from the client (asyncio's default is 64 KB)."""
STDERR_LINE_CHARS = 500
"""How much of one stderr line of the upstream an error message quotes."""
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate (\\ud83d\\ude00 for an emoji, or a lone one), or
text that looks like one after an escaped backslash (see _surrogate_escaped)."""
EXIT_GRACE_SECONDS = 2.0
"""How long an upstream may take to exit once its stdin is closed, and again after
SIGTERM, before the next step (the SDK's own timeouts)."""


@asynccontextmanager
async def stdio() -> AsyncIterator[Streams]:
    async with (
        _event_loop_stdio() as (stdin, stdout),
        stdio_server(stdin, stdout) as (read, write),
        anyio.create_task_group() as group,
    ):
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        group.start_soon(_answer_malformed, read, send, write)
        yield receive, write
        group.cancel_scope.cancel()


@asynccontextmanager
async def _event_loop_stdio() -> AsyncIterator[tuple[Any, Any]]:
    """stdin and stdout as the event loop's pipes, in the shape the SDK's stdio_server
    reads and writes (AsyncFile's lines, write and flush); (None, None), the SDK's own
    threads, where either is a regular file, which an event loop cannot watch (a
    request's refused id is then dropped, as the SDK drops it: no client waits at a
    file for its answer)."""
    if not all(_pollable(fd) for fd in (0, 1)):
        yield None, None
        return
    loop = asyncio.get_running_loop()
    stdin, stdout = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    saved_in, saved_out = os.dup(0), os.dup(1)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    read_pipe = os.fdopen(stdin, "rb", buffering=0)
    write_pipe = os.fdopen(stdout, "wb", buffering=0)
    try:
        protocol = asyncio.StreamReaderProtocol(reader)
        read_transport, _ = await loop.connect_read_pipe(lambda: protocol, read_pipe)
        write_transport, flow = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, write_pipe
        )
        writer = asyncio.StreamWriter(write_transport, flow, None, loop)
        try:
            yield _Lines(reader, writer), _Writes(writer)
        finally:
            read_transport.close()
            write_transport.close()
    finally:
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


def _pollable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


class _Lines:
    """A pipe's lines as text, as the SDK iterates an AsyncFile; a request whose id the
    SDK would take for a notification's (spillbox.mcp.ids) is answered here, on the
    writer, and not passed on."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while ids.refused_line(line := await self.reader.readline()):
            self.writer.write(_json_line(ids.refusal()))
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class _Writes:
    """A pipe written as the SDK writes an AsyncFile: write, then flush."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode())

    async def flush(self) -> None:
        await self.writer.drain()


async def _answer_malformed(
    source: ReadStream[SessionMessage | Exception],
    sink: MemoryObjectSendStream[SessionMessage | Exception],
    replies: WriteStream[SessionMessage],
) -> None:
    async with sink:
        async for item in source:
            if isinstance(item, Exception):
                await replies.send(SessionMessage(_error_for(item)))
            else:
                await sink.send(item)


def _error_for(error: Exception) -> types.JSONRPCError:
    """Parse error for a line that is not JSON, invalid request for JSON that is not a
    JSON-RPC message."""
    not_json = isinstance(error, ValidationError) and any(
        e["type"] == "json_invalid" for e in error.errors()
    )
    data = types.ErrorData(
        code=types.PARSE_ERROR if not_json else types.INVALID_REQUEST,
        message="Parse error: not JSON" if not_json else "Invalid request: not a JSON-RPC message",
    )
    return types.JSONRPCError(jsonrpc="2.0", id=None, error=data)


@asynccontextmanager
async def upstream_stdio(
    command: Sequence[str],
    env: Mapping[str, str],
    started: Callable[[anyio.abc.Process], None] = lambda process: None,
    stderr_tail: MutableSequence[str] | None = None,
    spool: Spool | None = None,
) -> AsyncIterator[Streams]:
    """Start command with env and speak MCP over its stdin and stdout; stop it on exit.
    started gets the process (for its exit status); its stderr goes on to this process's,
    each line also appended to stderr_tail (a bounded deque: why it exited); spool: where
    a long answer's long strings go (see _message)."""
    process = await anyio.open_process(
        list(command), env=dict(env), stderr=subprocess.PIPE, start_new_session=True
    )
    started(process)
    read_send, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write, write_receive = anyio.create_memory_object_stream[SessionMessage](0)
    async with anyio.create_task_group() as group:
        group.start_soon(_read_lines, process, read_send, spool)
        group.start_soon(_write_lines, process, write_receive)
        group.start_soon(_copy_stderr, process, [] if stderr_tail is None else stderr_tail)
        try:
            yield read, write
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            group.cancel_scope.cancel()


async def _read_lines(
    process: anyio.abc.Process,
    sink: MemoryObjectSendStream[SessionMessage | Exception],
    spool: Spool | None,
) -> None:
    assert process.stdout is not None
    async with sink:
        async for line in _StreamLines(process.stdout):
            try:
                message = _message(line, spool)
            except ValueError as e:
                await sink.send(e)  # the session reports it; the connection goes on
                continue
            try:
                await sink.send(SessionMessage(message))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return


def _message(line: bytearray, spool: Spool | None = None) -> types.JSONRPCMessage:
    """The JSON-RPC message one line of the upstream holds; line is emptied (its buffer
    freed) once decoded, so that a large result is held at most twice at any moment:
    the line and its text, then the text and the parsed message (once, with a spool).

    The stdlib's parser writes a string straight into the str it returns, and the
    message is then validated from those objects (pydantic keeps each str as it is).
    pydantic's own JSON parsing of a union (the four JSON-RPC message kinds) holds the
    whole document as its own tree besides, and unescapes each string in a buffer of its
    own: a 100 MB result took 6x its size (benchmarks/mcp_bench.py). A line with a
    surrogate escape is parsed by pydantic, as the SDK does: the stdlib takes a lone one
    (\\ud800), which no UTF-8 writer can pass on to the client.

    spool: a long line's long strings are moved there first (spillbox.mcp.spool), so that
    the result is held once; a message that is not a response gets them back at once."""
    if _surrogate_escaped(line):
        try:
            return types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        finally:
            line.clear()
    if len(line) < SPOOL_LINE_BYTES:
        spool = None
    try:
        if spool is not None:
            try:
                shrink(line, spool)
            except OSError:  # no temporary file to be had: the line is parsed as it is
                spool = None
        text = line.decode("utf-8")
    finally:
        line.clear()
    message = types.jsonrpc_message_adapter.validate_python(json.loads(text), by_name=False)
    if spool is not None and not isinstance(message, types.JSONRPCResponse):
        return spool.settle(message)
    return message


def _surrogate_escaped(line: bytearray) -> bool:
    """Whether line holds a JSON escape of a surrogate: one found by _SURROGATE_ESCAPE
    after an even run of backslashes (after an odd one it is the text "\\ud83d" that a
    JSON string holds, as a tool's JSON output escapes an emoji)."""
    return any(
        (match.start() - backslashes_from(line, match.start())) % 2 == 0
        for match in _SURROGATE_ESCAPE.finditer(line)
    )


class _StreamLines:
    """A byte stream's lines, each scanned once and held once: a long line grows in one
    buffer as its chunks arrive (no list of chunks to join), and each line is handed
    over as a bytearray the reader keeps no reference to."""

    def __init__(self, stream: anyio.abc.ByteReceiveStream) -> None:
        self.stream = stream
        self.chunk = b""
        self.start = 0
        """Where the unread rest of chunk starts."""

    def __aiter__(self) -> _StreamLines:
        return self

    async def __anext__(self) -> bytearray:
        line = bytearray()
        while (end := self.chunk.find(b"\n", self.start)) < 0:
            line += memoryview(self.chunk)[self.start :]
            try:
                self.chunk, self.start = await self.stream.receive(), 0
            except (
                anyio.EndOfStream,
                anyio.ClosedResourceError,
                anyio.BrokenResourceError,
                OSError,
            ):
                raise StopAsyncIteration from None  # the server exited
        line += memoryview(self.chunk)[self.start : end]
        self.start = end + 1
        return line


async def _copy_stderr(process: anyio.abc.Process, tail: MutableSequence[str]) -> None:
    """The server's stderr, line by line, to this process's stderr (where an MCP client
    shows a server's log) and to tail."""
    assert process.stderr is not None
    async for line in _StreamLines(process.stderr):
        text = line.decode("utf-8", errors="replace").rstrip()
        print(text, file=sys.stderr, flush=True)
        if text:
            tail.append(text[:STDERR_LINE_CHARS])


async def _write_lines(
    process: anyio.abc.Process, source: MemoryObjectReceiveStream[SessionMessage]
) -> None:
    assert process.stdin is not None
    async with source:
        async for item in source:
            try:
                await process.stdin.send(_json_line(item.message))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                return


def _json_line(message: types.JSONRPCMessage) -> bytes:
    """One message as a line of the wire, serialized as the SDK serializes it."""
    return (message.model_dump_json(by_alias=True, exclude_unset=True) + "\n").encode()


async def _stop(process: anyio.abc.Process) -> None:
    """Close its stdin and let it exit; then end its whole process group."""
    assert process.stdin is not None
    try:
        await process.stdin.aclose()
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    with anyio.move_on_after(EXIT_GRACE_SECONDS):
        # Not process.wait(): it waits for the pipes' EOF too, which a child that
        # inherited them holds open (the SDK polls as well).
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    if process.returncode is None:
        await terminate_posix_process_tree(process, EXIT_GRACE_SECONDS)
    await process.aclose()
