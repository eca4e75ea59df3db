"""spillbox inside Google ADK (issue 26), driven by a scripted BaseLlm that needs no network:
each test asserts on the LlmRequest the model was given.

The scenario (framework_scenario) runs in the real Docker sandbox under runc and gVisor; the
task-per-session, MCP and concurrency tests need no sandbox (sandbox="none")."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from framework_scenario import (
    CONFIG,
    EVENTS,
    OPEN_TOTAL,
    ORDERS,
    PARALLEL,
    SECRET,
    SMALL,
    TOOLS,
    USERS,
    check_sizes,
    notice_of,
    open_total_sql,
)
from google.adk.agents.llm_agent import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools.mcp_tool.mcp_session_manager import StdioConnectionParams
from google.adk.tools.mcp_tool.mcp_toolset import McpToolset
from google.genai import types
from mcp.client.stdio import StdioServerParameters
from pydantic import Field

from spillbox import Harness, Retention
from spillbox.integrations.google_adk import SpillboxPlugin, session_task_id

pytest_plugins = ["framework_fixtures"]  # the runtime and docker_harness fixtures

pytestmark = pytest.mark.anyio

TOY_SERVER = Path(__file__).parent.parent / "mcp" / "toy_server.py"

Script = Callable[[dict[str, list[dict[str, Any]]]], LlmResponse]
"""The next model turn, given the function responses the model received so far by tool."""


class Seen(NamedTuple):
    """What one model call was given: the conversation, and the tools it was offered."""

    contents: list[types.Content]
    tools: list[str]


class ScriptedLlm(BaseLlm):
    """A model that answers from a script, and keeps what every request gave it."""

    model: str = "scripted"
    script: Any = None
    seen: list[Seen] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncIterator[LlmResponse]:
        contents = [content.model_copy(deep=True) for content in llm_request.contents]
        self.seen.append(Seen(contents, list(llm_request.tools_dict)))
        yield self.script(received(contents))


def received(contents: list[types.Content]) -> dict[str, list[dict[str, Any]]]:
    """The function responses in a conversation, by tool name, in order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for content in contents:
        for part in content.parts or []:
            if part.function_response is not None:
                response = part.function_response
                found.setdefault(response.name or "", []).append(response.response or {})
    return found


def calls(*named: tuple[str, dict[str, Any]]) -> LlmResponse:
    parts = [types.Part.from_function_call(name=name, args=args) for name, args in named]
    return LlmResponse(content=types.Content(role="model", parts=parts))


def answer(text: str) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def tool(name: str, value: Any) -> Callable[[], Any]:
    def call() -> Any:
        return value

    call.__name__ = name
    call.__doc__ = f"Returns {name}."
    return call


async def run(runner: InMemoryRunner, session_id: str = "s1", user_id: str = "u1") -> str:
    """Run one user message; the final text the agent answered."""
    await runner.session_service.create_session(
        app_name=runner.app_name, user_id=user_id, session_id=session_id
    )
    message = types.Content(role="user", parts=[types.Part(text="go")])
    text = ""
    async for event in runner.run_async(
        user_id=user_id, session_id=session_id, new_message=message
    ):
        if event.is_final_response() and event.content and event.content.parts:
            text = "".join(part.text or "" for part in event.content.parts)
    return text


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # ADK runs on asyncio


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with Harness(sandbox="none", home=tmp_path / "home", gc_interval=-1) as harness:
        yield harness


def scenario_script(exec_name: str) -> Script:
    """The scenario's turns: the three parallel calls; the config and ping; the orders read
    back; the SQL; the answer."""

    def script(got: dict[str, list[dict[str, Any]]]) -> LlmResponse:
        if "list_orders" not in got:
            return calls(*[(name, {}) for name in PARALLEL])
        if "get_config" not in got:
            return calls(("get_config", {}), ("ping", {}))
        notice = notice_of(got["list_orders"][0]["result"])
        assert notice is not None
        if "read_artifact" not in got:
            [read] = [line for line in notice["hint"].splitlines() if line.startswith("read_")]
            return calls(("read_artifact", json.loads(read.partition(" ")[2])))
        if exec_name not in got:
            sql = open_total_sql(notice)
            args = {"lang": "sql", "code": sql, "artifact": None, "timeout": None}
            return calls((exec_name, {**args, "session": None, "reset_session": None}))
        output = json.loads(got[exec_name][0]["result"])["output"]
        return answer(output.split()[-1])  # the query's CSV: "total", then the sum

    return script


@pytest.mark.docker
async def test_scenario_in_the_docker_sandbox(docker_harness: Harness) -> None:
    check_sizes()
    spillbox = SpillboxPlugin(docker_harness, retention=Retention(redact=True), task_id=ticket)
    model = ScriptedLlm(script=scenario_script("sandbox_exec"))
    tools: list[Any] = [tool(name, text) for name, text in TOOLS.items() if name != "ping"]
    tools += [tool("ping", json.loads(SMALL)), spillbox.toolset()]
    agent = LlmAgent(name="analyst", model=model, tools=tools)
    runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=[spillbox]))
    session = None
    try:
        assert await run(runner) == str(OPEN_TOTAL)
        session = await runner.session_service.get_session(
            app_name=runner.app_name, user_id="u1", session_id="s1"
        )
        assert session is not None
        task = spillbox.task(session)
        assert task.id == "ticket-s1"
        final = received(model.seen[-1].contents)
        offered = set(model.seen[0].tools)
        assert {"sandbox_exec", "read_artifact", "list_artifacts"} <= offered
        # The step: orders over the per-call limit, users by the aggregate, events inline.
        orders, users = (notice_of(final[n][0]["result"]) for n in ("list_orders", "list_users"))
        assert orders is not None and users is not None
        assert orders["reason"].startswith("per_call") and users["reason"].startswith("aggregate")
        assert final["list_events"] == [{"result": EVENTS}]
        stored = {row.tool: task.read(row) for row in task.artifacts()}
        assert stored["list_orders"] == ORDERS.encode() and stored["list_users"] == USERS.encode()
        # Read back: the page holds the orders' first records.
        page = json.loads(final["read_artifact"][0]["result"])
        assert page["items"][0] == json.loads(ORDERS)[0]
        # The secret never reached the model; the small result is the tool's very dict.
        everything = [c.model_dump(mode="json") for seen in model.seen for c in seen.contents]
        assert SECRET not in json.dumps(everything)
        [config] = final["get_config"]
        assert json.loads(config["result"])["region"] == json.loads(CONFIG)["region"]
        assert final["ping"] == [json.loads(SMALL)]
    finally:
        if session is not None:
            await spillbox.end_session(session)
        await runner.close()


def ticket(session: Any) -> str:
    """A task id of the application's own choosing."""
    return f"ticket-{session.id}"


def app_runner(spillbox: SpillboxPlugin, script: Script, tools: list[Any]) -> InMemoryRunner:
    agent = LlmAgent(name="agent", model=ScriptedLlm(script=script), tools=tools)
    return InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=[spillbox]))


def once(*named: tuple[str, dict[str, Any]]) -> Script:
    """A model that makes these calls in one turn, then answers "done"."""
    return lambda got: answer("done") if got else calls(*named)


async def test_a_turns_calls_run_concurrently_as_one_step(harness: Harness) -> None:
    """ADK runs a turn's calls as concurrent tasks (each tool waits here for the other two
    to start), and their results pass the gate as one step: users (5.6k tokens) is
    offloaded only because with events (4.5k) the step is over its 10k."""
    barrier = asyncio.Barrier(3)

    def concurrent(name: str, value: Any) -> Callable[[], Any]:
        async def call() -> Any:
            async with asyncio.timeout(30):  # fails, not hangs, if ADK ran them one by one
                await barrier.wait()
            return value

        call.__name__ = name
        return call

    spillbox = SpillboxPlugin(harness)
    names = {"list_users": USERS, "list_events": EVENTS, "ping": SMALL}
    tools: list[Any] = [concurrent(name, value) for name, value in names.items()]
    runner = app_runner(spillbox, once(*[(name, {}) for name in names]), [*tools])
    try:
        await run(runner)
        model = runner.app.root_agent.model  # type: ignore[union-attr]
        got = received(model.seen[-1].contents)
        users = notice_of(got["list_users"][0]["result"])
        assert users is not None and users["reason"].startswith("aggregate"), users
        assert got["list_events"] == [{"result": EVENTS}] and got["ping"] == [{"result": SMALL}]
    finally:
        await runner.close()


async def test_a_task_per_session_closed_under_its_retention(harness: Harness) -> None:
    spillbox = SpillboxPlugin(harness, retention=Retention(keep_after_close=0))
    runner = app_runner(spillbox, once(("list_orders", {})), [tool("list_orders", ORDERS)])
    await run(runner, "s1", user_id="a/b")
    await run(runner, "s1", user_id="a")  # same session id, another user: another task
    first, second = "adk/shop/a%2Fb/s1", "adk/shop/a/s1"
    assert {first, second} <= set(harness.tasks())
    assert [row.tool for row in harness.existing(first).artifacts()] == ["list_orders"]
    session = await runner.session_service.get_session(
        app_name="shop", user_id="a/b", session_id="s1"
    )
    assert session is not None and session_task_id(session) == first
    await spillbox.end_session(session)  # keep_after_close=0: deleted now
    assert first not in harness.tasks() and second in harness.tasks()
    await runner.close()  # the runner's end closes the rest
    assert second not in harness.tasks()


async def test_a_dict_keeps_its_shape_and_media_stay_beside_a_notice(harness: Harness) -> None:
    """A small dict is the tool's very dict; one with a secret comes back as that dict
    redacted; a large result with an image is a notice, the image still shown."""
    png = types.Part.from_bytes(data=b"\x89PNG\r\n\x1a\nfake", mime_type="image/png")
    config = {"region": "eu-west-1", "aws_access_key_id": SECRET}
    chart = {"rows": json.loads(ORDERS), "chart": png}
    spillbox = SpillboxPlugin(harness, retention=Retention(redact=True))
    tools = [tool("ping", json.loads(SMALL)), tool("get_config", config), tool("chart", chart)]
    runner = app_runner(spillbox, once(("ping", {}), ("get_config", {}), ("chart", {})), tools)
    try:
        await run(runner)
        model = runner.app.root_agent.model  # type: ignore[union-attr]
        got = received(model.seen[-1].contents)
        assert got["ping"] == [json.loads(SMALL)]
        [shown] = got["get_config"]
        assert shown["region"] == "eu-west-1" and SECRET not in json.dumps(shown)
        assert set(shown) == set(config)
        [notice] = got["chart"]
        assert notice_of(notice["result"]) is not None
        [response] = [
            part.function_response
            for content in model.seen[-1].contents
            for part in content.parts or []
            if part.function_response is not None and part.function_response.name == "chart"
        ]
        [image] = response.parts or []
        assert image.inline_data is not None and image.inline_data.data == png.inline_data.data
    finally:
        await runner.close()


async def test_an_mcp_toolsets_results_pass_the_same_gate(harness: Harness) -> None:
    """McpToolset's tools go through the same callback: a CallToolResult whose
    structuredContent is large becomes the notice (the payload stored as the MCP proxy
    stores it); a small one is the very dict McpTool made."""
    params = StdioServerParameters(command=sys.executable, args=[str(TOY_SERVER)])
    mcp = McpToolset(connection_params=StdioConnectionParams(server_params=params, timeout=30))
    spillbox = SpillboxPlugin(harness)
    script = once(("wide", {"rows": 3000}), ("echo", {"text": "hi"}))
    runner = app_runner(spillbox, script, [mcp])
    try:
        await run(runner)
        model = runner.app.root_agent.model  # type: ignore[union-attr]
        got = received(model.seen[-1].contents)
        assert got["echo"] == [{"content": [{"type": "text", "text": "hi"}], "isError": False}]
        [wide] = got["wide"]
        assert "structuredContent" not in wide  # the tool declares no outputSchema
        notice = notice_of(wide["content"][0]["text"])
        assert notice is not None and notice["tool"] == "wide"
        session = await runner.session_service.get_session(
            app_name="shop", user_id="u1", session_id="s1"
        )
        assert session is not None
        [row] = spillbox.task(session).artifacts()
        stored = json.loads(spillbox.task(session).read(row))
        assert len(stored["structuredContent"]["rows"]) == 3000
    finally:
        await mcp.close()
        await runner.close()
