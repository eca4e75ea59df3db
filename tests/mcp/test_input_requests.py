"""Sampling and elicitation by an upstream, in each client era (issue 22 item 4), as the
README states it: a client of the 2025-11-25 handshake gets server-everything's requests
and its answers reach the server; a 2026-07-28 client's sampling and elicitation are not
offered upstream (spillbox does not bridge that era's input_required round trips), so
server-everything, which offers those tools only to a client that can answer, does not
list them, and a call of one is refused by the server, not left waiting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp_client import npm_server, proxy_params, text_of

from mcp import Client

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]

ASKING_TOOLS = {"trigger-sampling-request", "trigger-elicitation-request"}


async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> Any:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(text="relayed answer"), model="m"
    )


async def elicitation(ctx: Any, params: types.ElicitRequestParams) -> Any:
    return types.ElicitResult(action="decline")


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_upstreams_sampling_and_elicitation_in_each_client_era(
    mode: str, npm_servers: Path, home: Path
) -> None:
    params = proxy_params(home, npm_server(npm_servers, "mcp-server-everything"))
    async with Client(
        params, mode=mode, sampling_callback=sampling, elicitation_callback=elicitation
    ) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        with anyio.fail_after(60):  # an answer either way, not a call left waiting
            sampled = await client.call_tool(
                "trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}
            )
    if mode == "legacy":
        assert ASKING_TOOLS <= names
        assert not sampled.is_error and "relayed answer" in text_of(sampled)
    else:
        assert not ASKING_TOOLS & names and "echo" in names
        assert sampled.is_error and "trigger-sampling-request" in text_of(sampled)
