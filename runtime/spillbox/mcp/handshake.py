"""The handshake of one proxied connection, in either protocol era: the client's first
request (2025-11-25's initialize, or a 2026-07-28 request with its _meta) connects the
upstream, already started, with the client's capabilities; initialize and server/discover
are answered with the upstream's own, spillbox's tools and resources added."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    SERVER_INFO_META_KEY,
)
from mcp_types.version import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_PROTOCOL_VERSIONS,
)
from pydantic import ValidationError

from spillbox.mcp.relays import Client
from spillbox.mcp.upstream import Ctx, Upstream


class Handshake:
    """The proxy's middleware that connects its upstream on the client's first request."""

    def __init__(
        self,
        upstream: Upstream | None,
        client: Client,
        list_upstream_tools: Callable[[], Awaitable[None]],
    ) -> None:
        self.upstream = upstream
        self.client = client
        self._list_upstream_tools = list_upstream_tools
        self._spoken = False
        """Whether the client has sent a request besides server/discover."""
        self._listed = False
        """Whether the upstream's tools have been fetched once it connected."""

    async def __call__(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
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
            offer = modern_offer(ctx.params)
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
            await self._list_upstream_tools()
        if ctx.method == "initialize":
            return self._initialize_result(init.protocol_version)
        if ctx.method == "server/discover":
            return self._discover_result()
        return await call_next(ctx)

    def _initialize_result(self, requested: str) -> types.InitializeResult:
        """initialize's answer: the upstream's, in the era and version the client asked for
        (the newest the proxy speaks if it asked for one it does not)."""
        assert self.upstream is not None
        return types.InitializeResult(
            protocol_version=requested
            if requested in HANDSHAKE_PROTOCOL_VERSIONS
            else LATEST_HANDSHAKE_VERSION,
            capabilities=self.capabilities(modern=False),
            server_info=self.upstream.server_info
            or types.Implementation(name="spillbox", version=""),
            instructions=self.upstream.instructions,
        )

    def _discover_result(self) -> types.DiscoverResult:
        """server/discover's answer: the upstream's, for a 2026-07-28 client."""
        assert self.upstream is not None
        info = self.upstream.server_info
        meta = {SERVER_INFO_META_KEY: info.model_dump(by_alias=True, mode="json")} if info else None
        return types.DiscoverResult(
            supported_versions=list(MODERN_PROTOCOL_VERSIONS),
            capabilities=self.capabilities(modern=True),
            instructions=self.upstream.instructions,
            _meta=meta,
        )

    def capabilities(self, *, modern: bool) -> types.ServerCapabilities:
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


def modern_offer(
    params: Mapping[str, Any] | None,
) -> tuple[types.ClientCapabilities, types.Implementation | None]:
    """What a 2026-07-28 request's _meta declares, for the upstream: its capabilities
    (sampling, elicitation and roots included: the upstream's requests for them reach the
    client in input_required results, spillbox.mcp.inputs) and its client info."""
    meta = (params or {}).get("_meta") or {}
    try:
        capabilities = types.ClientCapabilities.model_validate(
            meta.get(CLIENT_CAPABILITIES_META_KEY) or {}, by_name=False
        )
        info = meta.get(CLIENT_INFO_META_KEY)
        client_info = types.Implementation.model_validate(info, by_name=False) if info else None
    except ValidationError:
        capabilities, client_info = types.ClientCapabilities(), None  # the SDK refuses it
    return capabilities, client_info
