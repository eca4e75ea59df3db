"""The upstream's requests to the proxy's client (sampling, elicitation, roots), in either
era on either side.

    client = Client(rounds.ask)             # a 2025-11-25 client's session is set later
    ClientSession(..., **relays(client, capabilities))    # what the client declared
    result = await until_complete(session, request, on_progress)   # a 2026-07-28 server's

A 2025-11-25 server sends them as requests, which the SDK's session hands to the relays; a
2026-07-28 server embeds them in an input_required result, which until_complete drives
through the same relays with the SDK's own driver. Either way they reach a 2025-11-25
client as requests of the proxy's, and a 2026-07-28 client in its calls' rounds
(spillbox.mcp.inputs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.client._input_required import run_input_required_driver
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.server.session import ServerSession
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, TypeAdapter

OR_INPUT_REQUIRED: dict[type[Any], TypeAdapter[Any]] = {
    types.CallToolRequest: TypeAdapter(types.CallToolResult | types.InputRequiredResult),
    types.GetPromptRequest: TypeAdapter(types.GetPromptResult | types.InputRequiredResult),
    types.ReadResourceRequest: TypeAdapter(types.ReadResourceResult | types.InputRequiredResult),
}
"""The requests a 2026-07-28 server may answer with input_required, and either answer."""


class Client:
    """The proxy's own client, as the upstream's relayed requests reach it: a 2025-11-25
    client's session, or, for a 2026-07-28 client (which has none), ask (its calls'
    input_required rounds, spillbox.mcp.inputs)."""

    def __init__(self, ask: Callable[[types.InputRequest, type[BaseModel]], Awaitable[Any]]):
        self.session: ServerSession | None = None
        """Set when a 2025-11-25 client's initialize arrives."""
        self.ready = anyio.Event()
        """Set when the client has sent notifications/initialized: requests may go to it."""
        self.ask = ask

    async def request(self, request: types.InputRequest, result_type: type[BaseModel]) -> Any:
        if self.session is None:
            return await self.ask(request, result_type)
        await self.ready.wait()
        try:
            return await self.session.send_request(request, result_type)
        except MCPError as e:
            return e.error


def relays(client: Client, capabilities: types.ClientCapabilities) -> dict[str, Any]:
    """A ClientSession's callbacks for what the client declared it can do, relaying the
    server's requests to it."""

    async def sampling(
        context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> Any:
        result_type: type[BaseModel] = (
            types.CreateMessageResultWithTools if params.tools else types.CreateMessageResult
        )
        return await client.request(types.CreateMessageRequest(params=params), result_type)

    async def elicitation(context: ClientRequestContext, params: types.ElicitRequestParams) -> Any:
        return await client.request(types.ElicitRequest(params=params), types.ElicitResult)

    async def roots(context: ClientRequestContext) -> Any:
        return await client.request(types.ListRootsRequest(), types.ListRootsResult)

    callbacks: dict[str, Any] = {}
    if capabilities.sampling is not None:
        callbacks["sampling_callback"] = sampling
    if capabilities.elicitation is not None:
        callbacks["elicitation_callback"] = elicitation
    if capabilities.roots is not None:
        callbacks["list_roots_callback"] = roots
    return callbacks


async def until_complete(session: ClientSession, request: Any, on_progress: ProgressFnT) -> Any:
    """A 2026-07-28 server's answer to request (one of OR_INPUT_REQUIRED's), its
    input_required results resolved by the SDK's own driver: each embedded request goes
    through the session's relays as a 2025-11-25 server's would, and request is sent again
    with the answers and the server's requestState."""
    either = OR_INPUT_REQUIRED[type(request)]

    async def send(responses: types.InputResponses | None, state: str | None) -> Any:
        params = request.params.model_copy(
            update={"input_responses": responses, "request_state": state}
        )
        again = request.model_copy(update={"params": params})
        return await session.send_request(again, either, progress_callback=on_progress)

    async def dispatch(key: str, asked: types.InputRequest) -> Any:
        meta = asked.params.meta if asked.params is not None else None
        context = ClientRequestContext(session=session, request_id=key, meta=meta)
        return await session.dispatch_input_request(context, asked)

    first = await session.send_request(request, either, progress_callback=on_progress)
    if not isinstance(first, types.InputRequiredResult):
        return first
    return await run_input_required_driver(first, dispatch=dispatch, retry=send)
