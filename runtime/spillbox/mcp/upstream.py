"""The real MCP server behind the proxy: a subprocess spoken to over stdio
(spillbox.mcp.transport), or a server at a URL over the SDK's streamable HTTP client; then
the SDK's ClientSession.

    upstream = Upstream(["npx", "server-everything"], client, on_notification)
    result = await upstream.start(task_group, client_params)   # its InitializeResult
    tools = await upstream.request(types.ListToolsRequest(...), types.ListToolsResult)

The upstream is offered exactly the capabilities the proxy's client declared (sampling,
elicitation, roots), and its requests for them are relayed to that client; its
notifications go to on_notification. When it exits, `exited` is set and every request
after that raises an MCPError that says so. A request that gets neither its answer nor a
progress notification for `timeout` seconds is cancelled upstream (the SDK sends
notifications/cancelled for it) and raises an MCPError with UPSTREAM_TIMEOUT.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client._transport import ReadStream
from mcp.client.session import ClientRequestContext, ClientSession, IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.server.session import ServerSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import BaseModel

from spillbox.mcp.transport import upstream_stdio

ResultT = TypeVar("ResultT", bound=BaseModel)
UPSTREAM_GONE = -32001
"""The JSON-RPC error code of a request the upstream can no longer answer."""
UPSTREAM_TIMEOUT = -32002
"""The JSON-RPC error code of a request the upstream left unanswered too long."""
DEFAULT_UPSTREAM_TIMEOUT_SECONDS = 300.0
"""How long a request may go without its answer or a progress notification."""
EXIT_STATUS_SECONDS = 1.0
"""How long to wait for an exit status once the server's output has ended."""


def exit_status(returncode: int) -> str:
    """'exited with status 3', 'was killed by signal 9 (SIGKILL)'."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-returncode}{name}"


class Client:
    """The proxy's own client, as the upstream's relayed requests reach it."""

    def __init__(self) -> None:
        self.session: ServerSession | None = None
        """Set when the client's initialize arrives."""
        self.ready = anyio.Event()
        """Set when the client has sent notifications/initialized: requests may go to it."""

    async def request(self, request: types.ServerRequest, result_type: type[ResultT]) -> Any:
        await self.ready.wait()
        assert self.session is not None
        try:
            return await self.session.send_request(request, result_type)
        except MCPError as e:
            return e.error


class Upstream:
    """One upstream MCP server: a subprocess spoken to over stdio (command), or a server
    that speaks streamable HTTP at url."""

    def __init__(
        self,
        command: Sequence[str] | None,
        client: Client,
        on_notification: Callable[[types.ServerNotification], Awaitable[None]],
        timeout: float | None = DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
        url: str | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("an upstream is a command or a URL, one of the two")
        self.command = list(command or ())
        self.url = url
        self.timeout = timeout
        """Seconds without an answer or progress before a request is cancelled; None: no limit."""
        self.client = client
        self.on_notification = on_notification
        self.session: ClientSession | None = None
        self.exited = anyio.Event()
        self.process: anyio.abc.Process | None = None

    @property
    def gone(self) -> str:
        if self.url is not None:
            return f"the upstream MCP server at {self.url} has closed the connection"
        status = self.process.returncode if self.process is not None else None
        how = "has exited" if status is None else exit_status(status)
        return f"the upstream MCP server ({' '.join(self.command)}) {how}"

    async def settled(self) -> str:
        """gone, once the process's exit status is known (its output may end first)."""
        with anyio.move_on_after(EXIT_STATUS_SECONDS):
            while self.process is not None and self.process.returncode is None:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        return self.gone

    async def start(
        self, group: anyio.abc.TaskGroup, client_params: types.InitializeRequestParams
    ) -> types.InitializeResult:
        """Start the server in group and initialize it; raises if either fails."""
        result: types.InitializeResult = await group.start(self._run, client_params)
        return result

    async def request(
        self,
        request: types.ClientRequest,
        result_type: type[ResultT],
        report: ProgressFnT | None = None,
    ) -> ResultT:
        """Send one request upstream; an MCPError with UPSTREAM_GONE once it has exited."""
        if self.session is None or self.exited.is_set():
            raise MCPError(UPSTREAM_GONE, self.gone)
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
                return await self.session.send_request(
                    request, result_type, progress_callback=on_progress
                )
            except MCPError as e:
                if e.code == types.CONNECTION_CLOSED:
                    raise MCPError(UPSTREAM_GONE, await self.settled()) from None
                raise
        raise MCPError(
            UPSTREAM_TIMEOUT,
            f"the upstream MCP server sent no answer and no progress for {self.timeout:g} s; "
            "spillbox cancelled the request",
        )

    async def notify(self, notification: types.ClientNotification) -> None:
        if self.session is not None and not self.exited.is_set():
            await self.session.send_notification(notification)

    async def _run(
        self,
        client_params: types.InitializeRequestParams,
        *,
        task_status: anyio.abc.TaskStatus[types.InitializeResult] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        # The server gets the proxy's whole environment: a client configuration's "env"
        # (tokens, settings) is given to spillbox and meant for the server.
        streams = (
            # No cap on one SSE event's size (the SDK's default is 1 MB): a large result
            # is what spillbox is there for.
            streamable_http_client(self.url, max_sse_event_size=None)
            if self.url is not None
            else upstream_stdio(self.command, os.environ, self._started)
        )
        async with streams as (read, write), anyio.create_task_group() as group:
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            group.start_soon(_until_eof, read, send, self.exited)
            async with _Relaying(
                client_params.capabilities,
                receive,
                write,
                message_handler=self._message,
                **self._relays(client_params),
            ) as session:
                result = await session.initialize()
                self.session = session
                task_status.started(result)
                await self.exited.wait()
            group.cancel_scope.cancel()

    def _started(self, process: anyio.abc.Process) -> None:
        self.process = process

    def _relays(self, client_params: types.InitializeRequestParams) -> dict[str, Any]:
        """Callbacks for what the client can do, relaying the server's requests to it."""
        capabilities = client_params.capabilities
        relays: dict[str, Any] = {"client_info": client_params.client_info}
        if capabilities.sampling is not None:
            relays["sampling_callback"] = self._sampling
        if capabilities.elicitation is not None:
            relays["elicitation_callback"] = self._elicitation
        if capabilities.roots is not None:
            relays["list_roots_callback"] = self._roots
        return relays

    async def _sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> Any:
        result_type: type[BaseModel] = (
            types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
        )
        return await self.client.request(types.CreateMessageRequest(params=params), result_type)

    async def _elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> Any:
        return await self.client.request(types.ElicitRequest(params=params), types.ElicitResult)

    async def _roots(self, context: ClientRequestContext) -> Any:
        return await self.client.request(types.ListRootsRequest(), types.ListRootsResult)

    async def _message(self, message: IncomingMessage) -> None:
        if not isinstance(message, Exception):
            await self.on_notification(message)


class _Relaying(ClientSession):
    """A ClientSession that offers the upstream exactly the capabilities the proxy's client
    declared (sampling's and elicitation's modes, roots' list_changed, experimental and
    extensions), but tasks, which the proxy does not relay. The SDK's own builds them from
    which callbacks are set: elicitation always as form and url, roots always with
    list_changed, nothing experimental."""

    def __init__(self, declared: types.ClientCapabilities, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.declared = declared.model_copy(update={"tasks": None})

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
