"""A 2025-era MCP session over streamable HTTP whose requests are answered with a JSON
body when nothing but their answer comes, and with an SSE stream when something does.

The SDK's session transport (StreamableHTTPServerTransport) picks one for the whole
session: SSE for every POST, which carries a call's progress notifications and the
requests the server makes of the client during it (sampling, elicitation, roots), or JSON
for every POST, which drops both. An SSE answer costs its server more (a response whose
body is a stream, its writer and ping tasks): about 0.7 ms of an echo call through
spillbox, 2.8 ms against 2.1 with JSON (benchmarks/mcp_bench.py). Here each request
waits for the first message meant for it: its answer is sent as one JSON body; anything
else (or DEFERRAL_SECONDS without a message) opens the SSE stream, that message first.
This is what the SDK's own 2026-07-28 path does with each request (handle_modern_request),
and the 2025 specification lets a server answer a POST either way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from http import HTTPStatus
from types import TracebackType
from typing import cast

import anyio
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.streamable_http import (
    CONTENT_TYPE_SSE,
    MCP_SESSION_ID_HEADER,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    SSEEvent,
    StreamableHTTPServerTransport,
)
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
)
from mcp_types import jsonrpc_message_adapter as messages
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from spillbox.mcp import ids

DEFERRAL_SECONDS = 15.0
"""How long a request's answer may be held back, waiting to be sent as JSON, before its
SSE stream is opened anyway (and pinged from then on, as the SDK's is): the SDK's own
2026-07-28 path waits as long (its _SSE_PING_INTERVAL)."""


class DeferredSSETransport(StreamableHTTPServerTransport):
    """The SDK's session transport, but that a request is answered with JSON unless a
    message besides its answer comes first (or none comes for DEFERRAL_SECONDS).

    Only requests take this path, and only in a session with no event store (spillbox
    keeps none: there is nothing to resume); an initialize, a notification, a client's
    answer, a body that is not JSON-RPC, and every GET and DELETE are the SDK's, as are
    the checks a request passes first (Accept, Content-Type, the session id)."""

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        body = await _json_in(request)
        message = _request_in(body)
        writer = self._read_stream_writer
        if (
            (message is None and not ids.refused(body))
            or writer is None
            or self._event_store is not None
            or self.is_json_response_enabled
        ):
            await super()._handle_post_request(scope, request, receive, send)
            return
        if not await self._validate_accept_header(request, scope, send):
            return
        if not self._check_content_type(request):  # the SDK says so, in its words
            await super()._handle_post_request(scope, request, receive, send)
            return
        if not await self._validate_request_headers(request, send):
            return
        refusal: tuple[str, HTTPStatus] | None = None
        if message is None:
            # The SDK takes it for a notification (202, and nothing runs or answers).
            refusal = (ids.REFUSAL, HTTPStatus.BAD_REQUEST)
        elif str(message.id) in self._request_streams:
            # Answers are routed by id: the later request would get the earlier's answer,
            # and the earlier none (the SDK's own path lets this happen).
            refusal = (
                "Conflict: a request with this id is in flight in this session; give each "
                "request an id of its own",
                HTTPStatus.CONFLICT,
            )
        if refusal is not None:
            await self._create_error_response(*refusal)(scope, receive, send)
            return
        assert message is not None
        request_id = str(message.id)
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
        inbox, events = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
        self._request_streams[request_id] = (inbox, events)
        await writer.send(self._create_session_message(message, request, request_id, version))
        first: EventMessage | None = None
        with anyio.move_on_after(DEFERRAL_SECONDS):
            try:
                first = await events.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                # The session was terminated with this request in flight.
                await self._clean_up_memory_streams(request_id)
                refused = self._create_error_response(
                    "Session terminated before the request completed",
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    INTERNAL_ERROR,
                )
                await refused(scope, receive, send)
                return
        if first is not None and isinstance(first.message, JSONRPCResponse | JSONRPCError):
            await self._clean_up_memory_streams(request_id)
            await self._create_json_response(first.message)(scope, receive, send)
            return
        await self._stream(request_id, events, first, scope, receive, send)

    async def _stream(
        self,
        request_id: str,
        events: MemoryObjectReceiveStream[EventMessage],
        first: EventMessage | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Answer on an SSE stream, as the SDK does, first (already taken) ahead of the
        request's other events."""
        sse_writer, sse_reader = anyio.create_memory_object_stream[SSEEvent](0)
        self._sse_stream_writers[request_id] = sse_writer
        source = events if first is None else _Prepended(first, events)
        headers = {
            "Cache-Control": "no-cache, no-transform",
            "Connection": "keep-alive",
            "Content-Type": CONTENT_TYPE_SSE,
            **({MCP_SESSION_ID_HEADER: self.mcp_session_id} if self.mcp_session_id else {}),
        }
        write_events = partial(
            self._run_sse_writer,
            request_id,
            sse_writer,
            # _Prepended is read as the SDK reads the stream (async with, async for).
            cast(MemoryObjectReceiveStream[EventMessage], source),
            None,
        )
        response = EventSourceResponse(
            content=sse_reader, data_sender_callable=write_events, headers=headers
        )
        try:
            await response(scope, receive, send)
        finally:
            await sse_reader.aclose()


async def _json_in(request: Request) -> object:
    """A POST's body as JSON (None if it is not JSON). The body is read once: starlette
    keeps it for the SDK's path."""
    try:
        return pydantic_core.from_json(await request.body())
    except ValueError:
        return None


def _request_in(body: object) -> JSONRPCRequest | None:
    """The JSON-RPC request body holds, but an initialize; None for anything else (the
    SDK's path answers those, and says what is wrong with a bad one)."""
    try:
        message = messages.validate_python(body, by_name=False)
    except ValidationError:
        return None
    if isinstance(message, JSONRPCRequest) and message.method != "initialize":
        return message
    return None


class _Prepended:
    """A request's event stream with the event already taken from it back in front."""

    def __init__(self, first: EventMessage, rest: MemoryObjectReceiveStream[EventMessage]):
        self.first = first
        self.rest = rest

    async def __aenter__(self) -> _Prepended:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.rest.aclose()

    def __aiter__(self) -> AsyncIterator[EventMessage]:
        return self._events()

    async def _events(self) -> AsyncIterator[EventMessage]:
        yield self.first
        async for event in self.rest:
            yield event
