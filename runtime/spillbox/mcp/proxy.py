"""The MCP server spillbox runs: in front of an upstream server (`spillbox mcp proxy`), or
with spillbox's tools alone (`spillbox mcp serve`).

    proxy = Proxy(task, ["npx", "@modelcontextprotocol/server-filesystem", "/data"], group)
    proxy = Proxy(task, None, group, url="http://127.0.0.1:3001/mcp")   # streamable HTTP
    await proxy.server.run(read, write, proxy.options())

The upstream is started with the proxy; the client's first request connects it, in
whichever era each side speaks (2025-11-25's initialize, 2026-07-28's server/discover and
per-request _meta). Everything but tools/call passes through to the upstream as it came
(the handshake's capabilities, resources, prompts, completions, logging, list_changed notifications,
progress, cancellation, and the upstream's sampling, elicitation and roots requests).
tools/call results pass the gate, the calls that overlap in time as one step
(spillbox.steps); spillbox's tools join the upstream's list, prefixed on a collision.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_types.methods import SPEC_CLIENT_METHODS, validate_client_request
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from spillbox.mcp.handshake import Handshake
from spillbox.mcp.inputs import STATE_SECONDS, Rounds, relay_progress
from spillbox.mcp.links import resource_link
from spillbox.mcp.local import LocalTools, as_call_result, gate_view
from spillbox.mcp.relays import Client
from spillbox.mcp.resources import Resources
from spillbox.mcp.results import ResultT, gated, redacted_passed, replaced, tool_result
from spillbox.mcp.spool import Spool
from spillbox.mcp.transport import stdio
from spillbox.mcp.upstream import (
    DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    UPSTREAM_GONE,
    UPSTREAM_START_SECONDS,
    UPSTREAM_TIMEOUT,
    Ctx,
    Upstream,
)
from spillbox.protocols import TaskHandle
from spillbox.steps import STEP_BOUND_SECONDS, Steps
from spillbox.tools import tool_names
from spillbox.types import ToolResult

# Requests passed to the upstream as they are, with the result each expects.
_FORWARDED: tuple[tuple[type[Any], type[BaseModel]], ...] = (
    (types.ListResourceTemplatesRequest, types.ListResourceTemplatesResult),
    (types.SubscribeRequest, types.EmptyResult),
    (types.UnsubscribeRequest, types.EmptyResult),
    (types.ListPromptsRequest, types.ListPromptsResult),
    (types.GetPromptRequest, types.GetPromptResult),
    (types.CompleteRequest, types.CompleteResult),
    (types.SetLevelRequest, types.EmptyResult),
)


class Proxy:
    """One client connection: its upstream (if any), spillbox's tools and the gate."""

    def __init__(
        self,
        task: TaskHandle,
        command: Sequence[str] | None,
        group: anyio.abc.TaskGroup,
        bound: float = STEP_BOUND_SECONDS,
        timeout: float | None = DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
        url: str | None = None,
        start_timeout: float = UPSTREAM_START_SECONDS,
    ) -> None:
        self.task = task
        self.group = group
        self.rounds = Rounds(group)
        self.client = Client(self.rounds.ask)
        self.upstream = (
            Upstream(command or None, self.client, self._from_upstream, timeout, url, start_timeout)
            if command or url
            else None
        )
        self.upstream_tools: dict[str, types.Tool] = {}
        self.local = LocalTools(task)
        self.steps = Steps(task.admit, bound)
        self.handshake = Handshake(self.upstream, self.client, self._refresh_tools)
        self.resources = Resources(task, self.upstream, lambda: self.local, self._redacted)
        self.server = self._server()

    def options(self) -> InitializationOptions:
        return self.server.create_initialization_options(NotificationOptions(tools_changed=True))

    def _server(self) -> Server[Any]:
        server: Server[Any] = Server(
            "spillbox", on_list_tools=self._list_tools, get_tool_input_schema=self._input_schema
        )
        # Registered as a request handler, whose result may be the wire's own dict.
        server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        # A 2026-07-28 client's calls that the upstream needs its input for are rounds
        # (spillbox.mcp.inputs), their requestState sealed and checked by the SDK's boundary.
        boundary = RequestStateBoundary(
            RequestStateSecurity.ephemeral(ttl=STATE_SECONDS), default_audience="spillbox"
        )
        server.middleware += [_named_invalid_params, self.handshake, boundary, self.rounds]
        # Offloaded payloads are resources (spillbox.mcp.links), whatever the upstream.
        server.add_request_handler(
            "resources/list", types.PaginatedRequestParams, self.resources.list
        )
        server.add_request_handler(
            "resources/read", types.ReadResourceRequestParams, self.resources.read
        )
        if self.upstream is not None:
            for request, result in _FORWARDED:
                method = request.model_fields["method"].default
                params = types.PaginatedRequestParams
                if request.model_fields["params"].is_required():
                    params = request.model_fields["params"].annotation
                server.add_request_handler(method, params, self._forward(request, result))
            server.add_request_handler("ping", types.RequestParams, self._ping)
            server.add_notification_handler(
                "notifications/roots/list_changed", types.NotificationParams, self._roots_changed
            )
        return server

    async def watch(self) -> None:
        """Tell the client when the upstream exits; spillbox's tools keep working."""
        if self.upstream is None:
            return
        await self.upstream.finished.wait()
        self.upstream_tools = {}
        if self.upstream.failure is not None:
            return  # it never served; the client's first request is told why
        gone = self.upstream.why(await self.upstream.settled())
        message = f"{gone}; spillbox's tools ({', '.join(self.local.names)}) still work"
        print(f"spillbox: {message}", file=sys.stderr)
        await self._to_client(
            types.LoggingMessageNotification(
                params=types.LoggingMessageNotificationParams(
                    level="error", logger="spillbox", data=message
                )
            )
        )
        await self._to_client(types.ToolListChangedNotification())

    async def _list_tools(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        await self._refresh_tools()
        tools = [*self.upstream_tools.values(), *self.local.definitions()]
        return types.ListToolsResult(tools=tools)

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        """A tool's inputSchema as last listed, for the SDK's check of a 2026-07-28 call's
        Mcp-Param headers against its arguments. Without it the SDK lists the tools anew
        for every call, here an upstream round trip: 1.7 of the 4.7 ms an echo call took
        over HTTP. A tool not listed since the upstream connected has no schema here, and
        its call's headers go unchecked, as the SDK does for a tool its listing lacks."""
        if name in self.local.names:
            tool = next(tool for tool in self.local.definitions() if tool.name == name)
        elif (listed := self.upstream_tools.get(name)) is not None:
            tool = listed
        else:
            return None
        return tool.input_schema

    async def _refresh_tools(self) -> None:
        """Fetch the upstream's whole tool list; rename ours if a name now collides."""
        if self.upstream is None or self.upstream.exited.is_set():
            return
        tools: dict[str, types.Tool] = {}
        cursor: str | None = None
        while True:
            request = types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor))
            try:
                page = await self.upstream.request(request, types.ListToolsResult)
            except MCPError as e:
                if e.code == UPSTREAM_GONE:
                    return
                raise
            tools.update((tool.name, tool) for tool in page.tools if _callable(tool))
            cursor = page.next_cursor
            if not cursor:
                break
        self.upstream_tools = tools
        if tool_names(self.task.languages, tools) != self.local.names:
            self.local = LocalTools(self.task, taken=tools)

    async def _call_tool(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult | dict[str, Any]:
        name = params.name
        original = types.CallToolResult(content=[])
        from_server = False
        """Whether original is the server's own (parsed from the wire), not spillbox's."""
        spooled: bytes | None = None
        """original's one text block, where the upstream's reader spooled it: its UTF-8."""

        async def run() -> ToolResult:
            nonlocal original, from_server, spooled
            # Numbered by the catalog (another proxy, or `mcp serve`, on this task never
            # gives a result the same name) from a block this task reserved; where a new
            # block is needed, in a thread while the call runs: the catalog's write is not
            # on the call's path.
            ready = self.task.reserved_call_id(name)
            numbered: list[str] = [] if ready is None else [ready]

            async def number() -> None:
                numbered.append(await anyio.to_thread.run_sync(self.task.next_call_id, name))

            output = None
            try:
                async with anyio.create_task_group() as numbering:
                    if not numbered:
                        numbering.start_soon(number)
                    if name in self.local.names:
                        output = await self.local.call(name, params.arguments)
                    else:
                        original, from_server = await self._upstream_call(ctx, params)
            except BaseExceptionGroup as e:
                raise e.exceptions[0] from None  # the call's own error, as it was raised
            if output is not None:
                original = as_call_result(output)
                return gate_view(numbered[0], name, output)
            if self.upstream is not None and from_server:
                spool = self.upstream.spool
                spooled = spool.payload(original)
                original = spool.settle(original)  # anything else spooled in it: as str
            if spooled is not None:  # the gate reads it as the bytes it is (LargeText)
                return ToolResult(numbered[0], name, spooled, is_error=original.is_error)
            return tool_result(numbered[0], name, original)

        admitted = await self.steps.run(run)
        if spooled is not None and not replaced(admitted):
            [block] = original.content  # the text stays in context: as str again
            text = spooled.decode("utf-8")
            original = original.model_copy(
                update={"content": [block.model_copy(update={"text": text})]}
            )
        tool = self.upstream_tools.get(name) if name not in self.local.names else None
        link = resource_link(self.task.id, admitted.artifact) if admitted.artifact else None
        shown = gated(original, admitted, tool.output_schema if tool is not None else None, link)
        if shown is not original or not from_server:
            return shown
        # Exactly as the server sent it: a dump of the model would add its defaults
        # ("isError": false). A 2026-07-28 client's result names its resultType.
        sent = original.model_dump(by_alias=True, mode="json", exclude_unset=True)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            sent.setdefault("resultType", "complete")
        return sent

    async def _upstream_call(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> tuple[types.CallToolResult, bool]:
        """The server's result and True; or spillbox's error result for a call the server
        did not answer, and False."""
        if self.upstream is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")
        try:
            request = types.CallToolRequest(params=params)
            with Spool.spooling():  # a long text comes as a placeholder: _call_tool takes it
                result = await self.upstream.request(
                    request, types.CallToolResult, relay_progress(ctx)
                )
            return result, True
        except MCPError as e:
            if e.code == UPSTREAM_TIMEOUT:
                text = f"{e.message} ({params.name}); the server may answer other calls"
            elif e.code == UPSTREAM_GONE:
                text = f"{e.message}; spillbox's tools still work"
            else:
                raise
            return types.CallToolResult(
                content=[types.TextContent(text=text)], is_error=True
            ), False

    def _forward(
        self, request: type[Any], result: type[BaseModel]
    ) -> Callable[[Ctx, Any], Awaitable[Any]]:
        async def handler(ctx: Ctx, params: Any) -> Any:
            assert self.upstream is not None
            answer = await self.upstream.request(
                request(params=params), result, relay_progress(ctx)
            )
            if isinstance(answer, types.GetPromptResult):  # a prompt's messages go to the model
                return self._redacted(answer, f"prompts/get {params.name}")
            return answer

        return handler

    def _redacted(self, result: ResultT, source: str) -> ResultT:
        """An upstream's result that reaches the model around the gate, redacted under a
        redacting policy (each replacement logged as what source returned)."""
        if not self.task.retention.redact:
            return result
        try:
            return redacted_passed(result, lambda text: self.task.redacted(text, source))
        except (ValueError, ValidationError) as e:
            raise MCPError(
                types.INTERNAL_ERROR,
                f"{source}: its redacted form does not read back ({e}); nothing of it is "
                "passed on under this task's redacting policy",
            ) from None

    async def _ping(self, ctx: Ctx, params: types.RequestParams) -> types.EmptyResult:
        """The client's ping goes to the upstream while there is one, so that it answers
        for the server behind spillbox too; spillbox answers alone once it has exited.
        (The upstream's pings are answered by the proxy's client session: the SDK gives
        that no hook.)"""
        assert self.upstream is not None
        if self.upstream.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return types.EmptyResult()  # 2026-07-28 has no ping
        try:
            return await self.upstream.request(types.PingRequest(), types.EmptyResult)
        except MCPError as e:
            if e.code != UPSTREAM_GONE:
                raise
            return types.EmptyResult()

    async def _roots_changed(self, ctx: Ctx, params: types.NotificationParams) -> None:
        assert self.upstream is not None
        await self.upstream.notify(types.RootsListChangedNotification())

    async def _from_upstream(self, notification: types.ServerNotification) -> None:
        if isinstance(notification, types.ToolListChangedNotification):
            await self._refresh_tools()
        await self._to_client(notification)

    async def _to_client(self, notification: types.ServerNotification) -> None:
        if self.client.session is not None:
            await self.client.session.send_notification(notification)


async def _named_invalid_params(ctx: Ctx, call_next: CallNext) -> HandlerResult:
    """Validate a request's params as the SDK will, but answer malformed ones with an
    error that names each field and what is wrong with it (the SDK's data is "")."""
    if ctx.request_id is not None and ctx.method in SPEC_CLIENT_METHODS:
        try:
            validate_client_request(ctx.method, ctx.protocol_version, ctx.params)
        except ValidationError as e:
            fields = [
                {"field": ".".join(str(part) for part in error["loc"]), "error": error["msg"]}
                for error in e.errors(include_url=False, include_input=False)
            ]
            first = fields[0] if fields else {"field": "params", "error": "invalid"}
            message = f"Invalid params: {first['field']}: {first['error']}"
            raise MCPError(types.INVALID_PARAMS, message, data=fields) from None
        except KeyError:
            pass  # not a method of this version: the SDK answers it
    return await call_next(ctx)


def _callable(tool: types.Tool) -> bool:
    """Whether the proxy can serve a call of tool: not one that must run as a task, which
    the proxy does not offer (a task's result would pass by the gate)."""
    return tool.execution is None or tool.execution.task_support != "required"


@asynccontextmanager
async def connection(
    task: TaskHandle,
    command: Sequence[str] | None,
    bound: float = STEP_BOUND_SECONDS,
    upstream_timeout: float | None = DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    url: str | None = None,
    start_timeout: float = UPSTREAM_START_SECONDS,
) -> AsyncIterator[Proxy]:
    """One client connection's proxy, its upstream started at once; on exit the upstream
    is stopped."""
    async with anyio.create_task_group() as group:
        proxy = Proxy(task, command, group, bound, upstream_timeout, url, start_timeout)
        if proxy.upstream is not None:
            group.start_soon(proxy.upstream.run)
        group.start_soon(proxy.watch)
        yield proxy
        group.cancel_scope.cancel()


async def serve_stdio(
    connect: Callable[[TaskHandle], AbstractAsyncContextManager[Proxy]], task: TaskHandle
) -> None:
    """Serve one client on stdin/stdout until it disconnects or SIGTERM or SIGHUP comes;
    then stop the upstream (and return, so that the caller closes the task at once)."""
    async with (
        connect(task) as proxy,
        stdio() as (read, write),
        anyio.create_task_group() as group,
    ):
        group.start_soon(_end_on_signal, group.cancel_scope)
        await proxy.server.run(read, write, proxy.options())
        group.cancel_scope.cancel()


async def _end_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for _ in signals:
            scope.cancel()
            return
