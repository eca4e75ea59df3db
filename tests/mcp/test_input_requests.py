"""An upstream's sampling, elicitation and roots requests, in each era on each side (issue
22): a 2025-11-25 client gets them as requests, a 2026-07-28 client in input_required
results that it answers by calling again (spillbox.mcp.inputs); a 2026-07-28 upstream's own
input_required results are driven through the same relays. The gate sees only the call's
final result, never an input_required one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp_client import http_connect, listening, npm_server, proxy_params, text_of, toy_server

from mcp import Client
from spillbox.notice import parse_notice

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]

ASKING_TOOLS = {"trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"}
ROOT = "file:///work/project"


class Answers:
    """The SDK client's callbacks, recording what each was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def sampling(self, ctx: Any, params: types.CreateMessageRequestParams) -> Any:
        assert isinstance(params.messages[0].content, types.TextContent)
        self.asked.append(f"sampling: {params.messages[0].content.text}")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="relayed answer"), model="m"
        )

    async def elicitation(self, ctx: Any, params: types.ElicitRequestParams) -> Any:
        self.asked.append("elicitation")
        return types.ElicitResult(action="accept", content={"color": "blue"})

    async def roots(self, ctx: Any) -> Any:
        self.asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri=ROOT, name="project")])

    def callbacks(self) -> dict[str, Any]:
        return {
            "sampling_callback": self.sampling,
            "elicitation_callback": self.elicitation,
            "list_roots_callback": self.roots,
        }


@pytest.mark.parametrize("mode", ["auto", "legacy", "2026-07-28"])
async def test_server_everythings_sampling_elicitation_and_roots_in_each_client_era(
    mode: str, npm_servers: Path, home: Path
) -> None:
    answers = Answers()
    params = proxy_params(home, npm_server(npm_servers, "mcp-server-everything"))
    async with Client(params, mode=mode, **answers.callbacks()) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        with anyio.fail_after(60):  # an answer, not a call left waiting
            sampled = await client.call_tool(
                "trigger-sampling-request", {"prompt": "hello", "maxTokens": 10}
            )
            elicited = await client.call_tool("trigger-elicitation-request", {})
            roots = await client.call_tool("get-roots-list", {})
    assert ASKING_TOOLS <= names
    assert not sampled.is_error and "relayed answer" in text_of(sampled)
    assert not elicited.is_error and "blue" in text_of(elicited)
    assert not roots.is_error and ROOT in text_of(roots)
    assert answers.asked[0].startswith("sampling: ") and answers.asked[0].endswith("hello")
    assert "elicitation" in answers.asked and "roots" in answers.asked


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_upstream_of_either_era_asks_a_client_of_either_era_and_the_gate_sees_the_end(
    mode: str, home: Path
) -> None:
    """The toy server's `ask` asks for sampling, then roots: as requests to a 2025-11-25
    client of its own (the proxy, for a legacy client), in two input_required rounds to a
    2026-07-28 one. Its 30,000-token answer is offloaded once, as the call's one result."""
    answers = Answers()
    async with Client(proxy_params(home, toy_server()), mode=mode, **answers.callbacks()) as c:
        with anyio.fail_after(60):
            small = await c.call_tool("ask", {"prompt": "small"})
            large = await c.call_tool("ask", {"prompt": "large", "size": 120_000})
            listed = await c.call_tool("list_artifacts", {})
    assert not small.is_error
    assert text_of(small).startswith(f"sampled: relayed answer; roots: {ROOT}")
    assert answers.asked == ["sampling: small", "roots", "sampling: large", "roots"]
    notice = parse_notice(text_of(large))
    assert notice is not None and notice["call_id"] == "ask_2", text_of(large)
    artifacts = json.loads(text_of(listed))
    assert [a["call_id"] for a in artifacts] == ["ask_2"]  # no artifact of a round


async def test_an_upstream_behind_a_2026_client_over_http(npm_servers: Path, home: Path) -> None:
    answers = Answers()
    command = npm_server(npm_servers, "mcp-server-everything")
    with listening(home, "proxy", "--", *command) as (url, _server):
        async with Client(url, mode="2026-07-28", **answers.callbacks()) as client:
            with anyio.fail_after(60):
                sampled = await client.call_tool(
                    "trigger-sampling-request", {"prompt": "over http", "maxTokens": 10}
                )
    assert not sampled.is_error and "relayed answer" in text_of(sampled)
    assert answers.asked[0].endswith("over http")


async def test_a_forged_replayed_or_wrong_answer_is_refused_in_one_line(home: Path) -> None:
    """requestState is the client's to echo, not to write: one the proxy did not mint, or
    minted for another call, or for a call already answered, is refused; an answer of the
    wrong shape is refused naming its key; the call can still be answered after that."""
    params = proxy_params(home, toy_server())
    async with Client(params, mode="2026-07-28", **Answers().callbacks()) as client:
        session = client.session
        first = await session.call_tool("ask", {"prompt": "p"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult)
        assert first.request_state and first.input_requests
        [(key, request)] = first.input_requests.items()
        assert request.method == "sampling/createMessage"

        async def retry(state: str | None, responses: Any, arguments: Any = None) -> Any:
            return await session.call_tool(
                "ask",
                arguments or {"prompt": "p"},
                request_state=state,
                input_responses=responses,
                allow_input_required=True,
            )

        refusals = []
        for arguments, state, responses in [
            ({"prompt": "p"}, "v1.forged", {}),
            ({"prompt": "other"}, first.request_state, {}),
            ({"prompt": "p"}, first.request_state, {key: {"roots": []}}),
        ]:
            with pytest.raises(Exception) as refused:
                await retry(state, responses, arguments)
            refusals.append(str(refused.value))
        answer = types.CreateMessageResult(
            role="assistant", content=types.TextContent(text="late"), model="m"
        )
        second = await retry(first.request_state, {key: answer})
        assert isinstance(second, types.InputRequiredResult)  # then the roots
        [roots_key] = (second.input_requests or {}).keys()
        roots = {roots_key: types.ListRootsResult(roots=[])}
        done = await retry(second.request_state, roots)
        with pytest.raises(Exception) as replayed:
            await retry(second.request_state, roots)
    assert refusals[0] == refusals[1] == "Invalid or expired requestState"
    assert f"inputResponses['{key}']" in refusals[2] and "sampling/createMessage" in refusals[2]
    assert isinstance(done, types.CallToolResult) and "sampled: late; roots: " in text_of(done)
    assert "no call of this server waits for input" in str(replayed.value)


async def test_an_upstream_asks_a_2025_client_over_http(home: Path) -> None:
    """The toy server's requests to the client, relayed on the call's SSE stream of a
    2025-11-25 session (the stream is opened by the first of them: the call's answer
    would have come as JSON alone)."""
    answers = Answers()
    with listening(home, "proxy", "--", *toy_server()) as (url, _server):
        async with http_connect(url, **answers.callbacks()) as session:
            with anyio.fail_after(60):
                asked = await session.call_tool("ask", {"prompt": "over http"})
    assert not asked.is_error
    assert text_of(asked).startswith(f"sampled: relayed answer; roots: {ROOT}")
    assert answers.asked == ["sampling: over http", "roots"]
