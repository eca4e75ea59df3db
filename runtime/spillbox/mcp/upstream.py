"""The real MCP server behind the proxy: a subprocess spoken to over stdio
(spillbox.mcp.transport), or a server at a URL over the SDK's streamable HTTP client; then
the SDK's ClientSession.

    upstream = Upstream(["npx", "server-everything"], client, on_notification)
    task_group.start_soon(upstream.run)           # started now, before any client speaks
    await upstream.connect(capabilities, client_info)   # either era, as the server speaks
    tools = await upstream.request(types.ListToolsRequest(...), types.ListToolsResult)

The upstream is offered exactly the capabilities the proxy's client declared (sampling,
elicitation, roots), and its requests for them are relayed to that client (a 2026-07-28
server's input_required results are driven through the same relays); its notifications
go to on_notification. When it exits, `exited` is set and every request
after that raises an MCPError that says so, with the exit status and the last lines of
the server's stderr. A request that gets neither its answer nor a
progress notification for `timeout` seconds is cancelled upstream (the SDK sends
notifications/cancelled for it) and raises an MCPError with UPSTREAM_TIMEOUT.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client._probe import negotiate_auto
from mcp.client._transport import ReadStream
from mcp.client.session import ClientSession, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.server.context import ServerRequestContext
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from spillbox.mcp.relays import OR_INPUT_REQUIRED, Client, relays, until_complete
from spillbox.mcp.spool import Spool, SpoolingSession
from spillbox.mcp.transport import upstream_stdio

ResultT = TypeVar("ResultT", bound=BaseModel)
Ctx = ServerRequestContext[Any, Any]
"""A request from the proxy's client, as the SDK's server hands it over."""
UPSTREAM_GONE = -32001
"""The JSON-RPC error code of a request the upstream can no longer answer."""
UPSTREAM_TIMEOUT = -32002
"""The JSON-RPC error code of a request the upstream left unanswered too long."""
DEFAULT_UPSTREAM_TIMEOUT_SECONDS = 300.0
"""How long a request may go without its answer or a progress notification."""
EXIT_STATUS_SECONDS = 1.0
"""How long to wait for an exit status once the server's output has ended."""
UPSTREAM_START_SECONDS = 8.0
"""How long the upstream may take to answer its handshake once the client's first request
has come: under the official SDK client's 10 s for server/discover, so that a client in
its default mode is told why instead of timing out. (It was started with the proxy; a
server that npx downloads on first use may need more: --upstream-start-timeout.)"""
STDERR_TAIL_LINES = 5
"""How many of the server's last stderr lines an error about its exit quotes."""


def exit_status(returncode: int) -> str:
    """'exited with status 3', 'was killed by signal 9 (SIGKILL)'."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-returncode}{name}"


class Upstream:
    """One upstream MCP server: a subprocess spoken to over stdio (command), or a server
    that speaks streamable HTTP at url.

    run starts it at once (in the proxy's task group), before any client has spoken, so
    that a command that does not exist or exits at once is known by the client's first
    request; connect then opens the MCP connection in the era the server speaks (the
    SDK's own negotiation: server/discover, falling back to initialize), offering the
    capabilities the proxy's client declared."""

    def __init__(
        self,
        command: Sequence[str] | None,
        client: Client,
        on_notification: Callable[[types.ServerNotification], Awaitable[None]],
        timeout: float | None = DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
        url: str | None = None,
        start_timeout: float = UPSTREAM_START_SECONDS,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("an upstream is a command or a URL, one of the two")
        self.command = list(command or ())
        self.url = url
        self.timeout = timeout
        """Seconds without an answer or progress before a request is cancelled; None: no limit."""
        self.start_timeout = start_timeout
        self.client = client
        self.on_notification = on_notification
        self.session: ClientSession | None = None
        self.exited = anyio.Event()
        self.process: anyio.abc.Process | None = None
        self.failure: str | None = None
        """Why the server could not be started or connected, once that is known."""
        self.finished = anyio.Event()
        """Set when run has returned: the server has exited (failure says if it never served)."""
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.spool = Spool()
        """A stdio server's long answers' long strings (spillbox.mcp.spool)."""
        self._offer: tuple[types.ClientCapabilities, types.Implementation | None] | None = None
        self._offered = anyio.Event()
        self._settled = anyio.Event()
        """Set once connect's outcome is known: a session, or a failure."""

    @property
    def name(self) -> str:
        if self.url is not None:
            return f"the upstream MCP server at {self.url}"
        return f"the upstream MCP server ({' '.join(self.command)})"

    @property
    def gone(self) -> str:
        if self.url is not None:
            return f"{self.name} has closed the connection"
        status = self.process.returncode if self.process is not None else None
        how = "has exited" if status is None else exit_status(status)
        return f"{self.name} {how}"

    def why(self, gone: str) -> str:
        """gone, with the last lines the server wrote to stderr."""
        if not self.stderr_tail:
            return gone
        return f"{gone}; its stderr ended with: {' | '.join(self.stderr_tail)}"

    @property
    def protocol_version(self) -> str | None:
        return self.session.protocol_version if self.session is not None else None

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        return self.session.server_capabilities if self.session is not None else None

    @property
    def server_info(self) -> types.Implementation | None:
        return self.session.server_info if self.session is not None else None

    @property
    def instructions(self) -> str | None:
        return self.session.instructions if self.session is not None else None

    async def settled(self) -> str:
        """gone, once the process's exit status is known (its output may end first)."""
        with anyio.move_on_after(EXIT_STATUS_SECONDS):
            while self.process is not None and self.process.returncode is None:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        return self.gone

    async def connect(
        self, capabilities: types.ClientCapabilities, client_info: types.Implementation | None
    ) -> None:
        """Open the MCP connection, offering capabilities (only the first call's offer is
        made); raises an MCPError with UPSTREAM_GONE that says why if it cannot be."""
        if self._offer is None:
            self._offer = (capabilities, client_info)
            self._offered.set()
        await self._settled.wait()
        if self.failure is not None:
            raise MCPError(UPSTREAM_GONE, self.failure)

    async def request(
        self,
        request: types.ClientRequest,
        result_type: type[ResultT],
        report: ProgressFnT | None = None,
    ) -> ResultT:
        """Send one request upstream; an MCPError with UPSTREAM_GONE once it has exited
        (saying whether it had before this request or did during it)."""
        if self.session is None or self.exited.is_set():
            reason = self.failure or self.why(f"{await self.settled()} before this call")
            raise MCPError(UPSTREAM_GONE, reason)
        with anyio.CancelScope() as scope:
            if self.timeout is not None:
                scope.deadline = anyio.current_time() + self.timeout

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                if self.timeout is not None:  # a server still at work is given more time
                    scope.deadline = anyio.current_time() + self.timeout
                if report is not None:
                    await report(progress, total, message)

            try:
                if type(request) not in OR_INPUT_REQUIRED or self.protocol_version not in (
                    MODERN_PROTOCOL_VERSIONS
                ):
                    result = await self.session.send_request(
                        request, result_type, progress_callback=on_progress
                    )
                    return _unstamped(result)
                answered: ResultT = await until_complete(self.session, request, on_progress)
                return _unstamped(answered)
            except MCPError as e:
                if e.code == types.CONNECTION_CLOSED:
                    gone = f"{await self.settled()} during this call"
                    raise MCPError(UPSTREAM_GONE, self.why(gone)) from None
                raise
        raise MCPError(
            UPSTREAM_TIMEOUT,
            f"the upstream MCP server sent no answer and no progress for {self.timeout:g} s; "
            "spillbox cancelled the request",
        )

    async def notify(self, notification: types.ClientNotification) -> None:
        if self.session is not None and not self.exited.is_set():
            await self.session.send_notification(notification)

    async def run(self) -> None:
        """Start the server, connect when asked to, and serve until it exits or this is
        cancelled; a failure to start or connect is recorded (failure), never raised."""
        try:
            await self._run()
        except Exception as e:  # noqa: BLE001 - the client's first request is told why
            if self.failure is None:
                self.failure = self.why(f"{self.name} could not be started: {one_line(e)}")
        finally:
            if self.failure is not None:
                print(f"spillbox: {self.failure}", file=sys.stderr)
            self.exited.set()
            self._settled.set()
            self.finished.set()

    async def _run(self) -> None:
        # The server gets the proxy's whole environment: a client configuration's "env"
        # (tokens, settings) is given to spillbox and meant for the server.
        streams = (
            # No cap on one SSE event's size (the SDK's default is 1 MB): a large result
            # is what spillbox is there for.
            streamable_http_client(self.url, max_sse_event_size=None)
            if self.url is not None
            else upstream_stdio(
                self.command, os.environ, self._started, self.stderr_tail, self.spool
            )
        )
        async with streams as (read, write), anyio.create_task_group() as group:
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            group.start_soon(_until_eof, read, send, self.exited)
            await self._offered.wait()
            assert self._offer is not None
            capabilities, client_info = self._offer
            async with _Relaying(
                capabilities,
                self.spool,
                receive,
                write,
                message_handler=self._message,
                client_info=client_info,
                **relays(self.client, capabilities),
            ) as session:
                await self._negotiate(session)
                self.session = session
                self._settled.set()
                await self.exited.wait()
            group.cancel_scope.cancel()

    async def _negotiate(self, session: ClientSession) -> None:
        """The SDK's own era negotiation, bounded by start_timeout and by the server's
        exit (a server that exits while starting is reported as that, at once)."""
        async with anyio.create_task_group() as group:

            async def exit_ends_it() -> None:
                await self.exited.wait()
                group.cancel_scope.cancel()

            group.start_soon(exit_ends_it)
            with anyio.move_on_after(self.start_timeout) as waited:
                try:
                    await negotiate_auto(session)
                except MCPError as e:
                    if e.code != types.CONNECTION_CLOSED:
                        self.failure = self.why(f"{self.name} refused the handshake: {e.message}")
                    else:
                        await self.exited.wait()  # its exit ends this at once
            group.cancel_scope.cancel()
        if self.failure is None and self.exited.is_set():
            self.failure = self.why(f"{await self.settled()} before it answered")
        elif self.failure is None and waited.cancelled_caught:
            self.failure = self.why(
                f"{self.name} did not answer initialize within {self.start_timeout:g} s "
                "(--upstream-start-timeout)"
            )
        if self.failure is not None:
            raise MCPError(UPSTREAM_GONE, self.failure)

    def _started(self, process: anyio.abc.Process) -> None:
        self.process = process

    async def _message(self, message: IncomingMessage) -> None:
        if not isinstance(message, Exception):
            await self.on_notification(message)


def _unstamped(result: ResultT) -> ResultT:
    """result without the serverInfo stamp a 2026-07-28 server puts in every result's
    _meta: it belongs to that hop (the proxy stamps its own where its client is of that
    era), and it is not part of what the tool answered, which the gate counts and stores."""
    meta = getattr(result, "meta", None)
    if not isinstance(meta, dict) or SERVER_INFO_META_KEY not in meta:
        return result
    rest = {key: value for key, value in meta.items() if key != SERVER_INFO_META_KEY}
    unstamped = result.model_copy(update={"meta": rest or None})
    if not rest:  # as if the server had sent no _meta: a dump of what it set leaves it out
        unstamped.model_fields_set.discard("meta")
    return unstamped


def one_line(error: BaseException) -> str:
    """One line for what went wrong, from the innermost cause of an exception group."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    return str(error) or type(error).__name__


class _Relaying(SpoolingSession):
    """A ClientSession that offers the upstream exactly the capabilities the proxy's client
    declared (sampling's and elicitation's modes, roots' list_changed, experimental and
    extensions), but tasks, which the proxy does not relay. The SDK's own builds them from
    which callbacks are set: elicitation always as form and url, roots always with
    list_changed, nothing experimental. Its answers' spooled strings come back as str but
    where the caller spools (spillbox.mcp.spool)."""

    def __init__(
        self, declared: types.ClientCapabilities, spool: Spool, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.declared = declared.model_copy(update={"tasks": None})
        self.spool = spool

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        return self.declared


async def _until_eof(
    source: ReadStream[SessionMessage | Exception],
    sink: MemoryObjectSendStream[SessionMessage | Exception],
    eof: anyio.Event,
) -> None:
    """Pass the server's messages on; set eof when its output ends (it exited)."""
    try:
        async with sink:
            async for item in source:
                await sink.send(item)
    finally:
        eof.set()
