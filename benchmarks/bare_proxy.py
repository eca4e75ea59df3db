"""A bare pass-through MCP proxy on the installed SDK, for mcp_bench's HTTP comparison.

It does what every proxy must and nothing more: the SDK's own streamable HTTP server in
front, the SDK's own stdio client behind, tools listed and called straight through (no
gate, no store, no catalog). What it adds to a call is what this SDK's two halves and
one more hop cost, the floor under any proxy built on it, spillbox's included; mcp-proxy
runs on mcp<2, so the gap between the two is part SDK, part proxy, and this tells them
apart.

    python benchmarks/bare_proxy.py PORT -- COMMAND [ARGS...]
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.lowlevel.server import Server


async def serve(port: int, command: list[str]) -> None:
    """Serve at http://127.0.0.1:PORT/mcp until stopped, in front of COMMAND over stdio."""
    upstream_params = StdioServerParameters(command=command[0], args=command[1:])
    async with (
        stdio_client(upstream_params) as (read, write),
        ClientSession(read, write) as upstream,
    ):
        await upstream.initialize()

        async def list_tools(_: Any, params: types.PaginatedRequestParams | None) -> Any:
            # The cursor alone: the client's params carry its own era's _meta envelope,
            # which a 2025 upstream refuses when its client speaks 2026-07-28.
            cursor = params.cursor if params is not None else None
            return await upstream.list_tools(params=types.PaginatedRequestParams(cursor=cursor))

        async def call_tool(_: Any, params: types.CallToolRequestParams) -> Any:
            return await upstream.call_tool(params.name, params.arguments)

        server: Server[Any] = Server("bare-proxy", on_list_tools=list_tools, on_call_tool=call_tool)
        app = server.streamable_http_app()
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        await uvicorn.Server(config).serve()


if __name__ == "__main__":
    port, dashes, *upstream = sys.argv[1:]
    if dashes != "--" or not upstream:
        raise SystemExit("usage: bare_proxy.py PORT -- COMMAND [ARGS...]")
    anyio.run(serve, int(port), upstream)
