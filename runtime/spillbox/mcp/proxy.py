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
(spillbox.mcp.step); spillbox's tools join the upstream's list, prefixed on a collision.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    SERVER_INFO_META_KEY,
)
from mcp_types.methods import SPEC_CLIENT_METHODS, validate_client_request
from mcp_types.version import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_PROTOCOL_VERSIONS,
)
from pydantic import BaseModel, ValidationError

from spillbox.mcp.links import artifact_uri, parse_uri, resource, resource_link
from spillbox.mcp.local import LocalTools, as_call_result, gate_view
from spillbox.mcp.results import ResultT, gated, redacted_passed, tool_result
from spillbox.mcp.step import STEP_BOUND_SECONDS, Steps
from spillbox.mcp.transport import stdio
from spillbox.mcp.upstream import (
    DEFAULT_UPSTREAM_TIMEOUT_SECONDS,
    UPSTREAM_GONE,
    UPSTREAM_START_SECONDS,
    UPSTREAM_TIMEOUT,
    Client,
    Upstream,
)
from spillbox.protocols import TaskHandle
from spillbox.tools import tool_names
from spillbox.types import Admitted, ToolResult

ADMIT_IN_LOOP_CHARS = 4096
"""A step's results of up to this many characters in all are gated on the event loop
(well under a millisecond); larger ones in a worker thread, so that counting and storing
them does not hold up other calls' messages. A thread hop costs about half a millisecond."""

Ctx = ServerRequestContext[Any, Any]

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
        self.client = Client()
        self.upstream = (
            Upstream(command or None, self.client, self._from_upstream, timeout, url, start_timeout)
            if command or url
            else None
        )
        self.upstream_tools: dict[str, types.Tool] = {}
        self.local = LocalTools(task)
        self.steps = Steps(self._admit, bound)
        self._admitting = anyio.Lock()
        self._calls = itertools.count(1)
        self._spoken = False
        """Whether the client has sent a request besides server/discover."""
        self._listed = False
        """Whether the upstream's tools have been fetched once it connected."""
        self.server = self._server()

    def options(self) -> InitializationOptions:
        return self.server.create_initialization_options(NotificationOptions(tools_changed=True))

    def _server(self) -> Server[Any]:
        server: Server[Any] = Server("spillbox", on_list_tools=self._list_tools)
        # Registered as a request handler, whose result may be the wire's own dict.
        server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        server.middleware += [_named_invalid_params, self._handshake]
        # Offloaded payloads are resources (spillbox.mcp.links), whatever the upstream.
        server.add_request_handler(
            "resources/list", types.PaginatedRequestParams, self._list_resources
        )
        server.add_request_handler(
            "resources/read", types.ReadResourceRequestParams, self._read_resource
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

    async def _handshake(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        """Connect the upstream (already started) with the capabilities of the client's
        first request, in either era: initialize's, or a 2026-07-28 request's _meta; answer
        initialize and server/discover with the upstream's own. A failure to connect fails
        initialize, or the first request after server/discover, with the reason."""
        if ctx.method == "notifications/initialized":
            result = await call_next(ctx)
            self.client.ready.set()
            return result
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and ctx.request_id is not None
        if ctx.method == "initialize":
            self.client.session = ctx.session
            try:
                init = types.InitializeRequestParams.model_validate(ctx.params or {}, by_name=False)
            except ValidationError:
                return await call_next(ctx)  # the SDK answers with the error
            offer: tuple[types.ClientCapabilities, types.Implementation | None] = (
                init.capabilities,
                init.client_info,
            )
        elif modern:
            offer = _modern_offer(ctx.params)
        else:
            return await call_next(ctx)
        if self.upstream is None:
            return await call_next(ctx)
        discover = ctx.method == "server/discover"
        first = not self._spoken and not discover
        self._spoken = self._spoken or not discover
        try:
            await self.upstream.connect(*offer)
        except MCPError:
            # server/discover is answered (spillbox's own): the SDK client, refused, would
            # try initialize on the same connection and show its refusal instead of why.
            if first or ctx.method == "initialize":
                raise
            return await call_next(ctx)
        if not self._listed:
            self._listed = True
            await self._refresh_tools()
        if ctx.method == "initialize":
            requested = init.protocol_version
            return types.InitializeResult(
                protocol_version=requested
                if requested in HANDSHAKE_PROTOCOL_VERSIONS
                else LATEST_HANDSHAKE_VERSION,
                capabilities=self._capabilities(modern=False),
                server_info=self.upstream.server_info
                or types.Implementation(name="spillbox", version=""),
                instructions=self.upstream.instructions,
            )
        if ctx.method == "server/discover":
            info = self.upstream.server_info
            meta = (
                {SERVER_INFO_META_KEY: info.model_dump(by_alias=True, mode="json")}
                if info
                else None
            )
            return types.DiscoverResult(
                supported_versions=list(MODERN_PROTOCOL_VERSIONS),
                capabilities=self._capabilities(modern=True),
                instructions=self.upstream.instructions,
                _meta=meta,
            )
        return await call_next(ctx)

    def _capabilities(self, *, modern: bool) -> types.ServerCapabilities:
        """The upstream's capabilities, with spillbox's tools and resources. Task-augmented
        calls (tasks/*) are not passed through: they would skip the gate. A 2026-07-28
        client gets no listChanged: its list changes come on subscriptions/listen, which
        the proxy does not serve."""
        assert self.upstream is not None and self.upstream.capabilities is not None
        upstream = self.upstream.capabilities
        return upstream.model_copy(
            update={
                "tools": types.ToolsCapability(list_changed=None if modern else True),
                "tasks": None,
                "resources": upstream.resources or types.ResourcesCapability(),
            }
        )

    async def _list_tools(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        await self._refresh_tools()
        tools = [*self.upstream_tools.values(), *self.local.definitions()]
        return types.ListToolsResult(tools=tools)

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
        call_id = f"{name}_{next(self._calls)}"
        original = types.CallToolResult(content=[])
        from_server = False
        """Whether original is the server's own (parsed from the wire), not spillbox's."""

        async def run() -> ToolResult:
            nonlocal original, from_server
            if name in self.local.names:
                output = await self.local.call(name, params.arguments)
                original = as_call_result(output)
                return gate_view(call_id, name, output)
            original, from_server = await self._upstream_call(ctx, params)
            return tool_result(call_id, name, original)

        admitted = await self.steps.run(run)
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

    async def _list_resources(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        """The upstream's resources where it has any, else the task's stored payloads."""
        if self._upstream_has_resources():
            assert self.upstream is not None
            request = types.ListResourcesRequest(params=params)
            return await self.upstream.request(request, types.ListResourcesResult)
        rows = await anyio.to_thread.run_sync(self.task.artifacts)
        return types.ListResourcesResult(resources=[resource(row) for row in rows])

    async def _read_resource(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        """A page of a stored payload; any other URI is the upstream's."""
        try:
            parsed = parse_uri(str(params.uri))
        except ValueError as e:
            raise MCPError(types.INVALID_PARAMS, f"{params.uri}: {e}") from None
        if parsed is None:
            if self.upstream is None:
                raise MCPError(types.INVALID_PARAMS, f"unknown resource {params.uri}")
            request = types.ReadResourceRequest(params=params)
            read = await self.upstream.request(request, types.ReadResourceResult, _progress(ctx))
            return self._redacted(read, f"resources/read {params.uri}")
        task_id, artifact_id, query = parsed
        if task_id != self.task.id:
            raise MCPError(
                types.INVALID_PARAMS,
                f"{params.uri} is a payload of task {task_id}; this connection serves task "
                f"{self.task.id} (spillbox mcp serve --task {task_id} reads it)",
            )
        output = await anyio.to_thread.run_sync(self.local.read_page, artifact_id, query)
        if output.is_error:
            raise MCPError(types.INVALID_PARAMS, output.text)
        page = json.loads(output.text)
        page["next_uri"] = (
            artifact_uri(task_id, artifact_id, page["next_cursor"]) if page["next_cursor"] else None
        )
        text = json.dumps(page, ensure_ascii=False)
        contents = types.TextResourceContents(
            uri=params.uri, mime_type="application/json", text=text
        )
        return types.ReadResourceResult(contents=[contents])

    def _upstream_has_resources(self) -> bool:
        if self.upstream is None or self.upstream.exited.is_set():
            return False
        capabilities = self.upstream.capabilities
        return capabilities is not None and capabilities.resources is not None

    async def _upstream_call(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> tuple[types.CallToolResult, bool]:
        """The server's result and True; or spillbox's error result for a call the server
        did not answer, and False."""
        if self.upstream is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")
        try:
            request = types.CallToolRequest(params=params)
            result = await self.upstream.request(request, types.CallToolResult, _progress(ctx))
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

    async def _admit(self, results: Sequence[ToolResult]) -> list[Admitted]:
        # One step at a time: a small step gated on the loop never waits there for the
        # task's lock while a large one is stored in a thread.
        async with self._admitting:
            if sum(len(result.content) for result in results) <= ADMIT_IN_LOOP_CHARS:
                return self.task.admit(results)
            return await anyio.to_thread.run_sync(self.task.admit, results)

    def _forward(
        self, request: type[Any], result: type[BaseModel]
    ) -> Callable[[Ctx, Any], Awaitable[Any]]:
        async def handler(ctx: Ctx, params: Any) -> Any:
            assert self.upstream is not None
            answer = await self.upstream.request(request(params=params), result, _progress(ctx))
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


def _modern_offer(
    params: Mapping[str, Any] | None,
) -> tuple[types.ClientCapabilities, types.Implementation | None]:
    """What a 2026-07-28 request's _meta declares, for the upstream: its capabilities but
    sampling, elicitation and roots, since the proxy cannot send a 2026-07-28 client
    requests to relay them."""
    meta = (params or {}).get("_meta") or {}
    try:
        declared = types.ClientCapabilities.model_validate(
            meta.get(CLIENT_CAPABILITIES_META_KEY) or {}, by_name=False
        )
        info = meta.get(CLIENT_INFO_META_KEY)
        client_info = types.Implementation.model_validate(info, by_name=False) if info else None
    except ValidationError:
        declared, client_info = types.ClientCapabilities(), None  # the SDK refuses the request
    relayed = {"sampling": None, "elicitation": None, "roots": None}
    capabilities = declared.model_copy(update=relayed)
    return capabilities, client_info


def _progress(ctx: Ctx) -> ProgressFnT | None:
    """Progress for an upstream request, routed back under the client's own token."""
    if progress_token_from_params(ctx.params) is None:
        return None

    async def report(progress: float, total: float | None, message: str | None) -> None:
        await ctx.session.report_progress(progress, total, message)

    return report


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
