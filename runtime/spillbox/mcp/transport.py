"""MCP over this process's stdin and stdout (the SDK's stdio server), where a line that is
not a JSON-RPC message gets a JSON-RPC error (id null), as JSON-RPC asks, instead of being
dropped in silence.

    async with stdio() as (read, write):
        await server.run(read, write, options)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client._transport import ReadStream, WriteStream
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

Streams = tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]


@asynccontextmanager
async def stdio() -> AsyncIterator[Streams]:
    async with stdio_server() as (read, write), anyio.create_task_group() as group:
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        group.start_soon(_answer_malformed, read, send, write)
        yield receive, write
        group.cancel_scope.cancel()


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
