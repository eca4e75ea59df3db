"""spillbox inside a real PydanticAI agent (issue 26), driven by PydanticAI's own
FunctionModel: its function reads the messages the agent sends it, so every assertion is on
what the model actually received."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import framework_scenario as scenario
import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from spillbox import Harness
from spillbox.integrations.pydantic_ai import Spillbox
from spillbox.retention import Retention

pytest_plugins = ["framework_fixtures"]  # the runtime and docker_harness fixtures


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """The tool returns of the last request the model was sent."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    return [p for p in last.parts if isinstance(p, ToolReturnPart)]


def calls(*named: tuple[str, dict[str, Any]]) -> ModelResponse:
    return ModelResponse(
        parts=[ToolCallPart(name, args, f"{name}-{i}") for i, (name, args) in enumerate(named)]
    )


def scenario_agent(capability: Spillbox, seen: dict[str, Any]) -> Agent[None, str]:
    """An agent with the scenario's tools, whose model runs the scenario and keeps in seen
    what it received at each turn."""
    small = json.loads(scenario.SMALL)
    seen["small"] = small

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = len([m for m in messages if isinstance(m, ModelResponse)])
        seen.setdefault("tools", [t.name for t in info.function_tools])
        if turn == 0:
            return calls(*((name, {}) for name in scenario.PARALLEL))
        if turn == 1:
            seen["step"] = {p.tool_name: p.content for p in returns(messages)}
            notice = scenario.notice_of(seen["step"]["list_orders"])
            assert notice is not None
            seen["notice"] = notice
            return calls(("read_artifact", {"path": notice["path"]}))
        if turn == 2:
            [page] = returns(messages)
            seen["page"] = json.loads(page.content)
            sql = scenario.open_total_sql(seen["notice"])
            return calls(("sandbox_exec", {"lang": "sql", "code": sql}))
        if turn == 3:
            [answer] = returns(messages)
            seen["sql"] = json.loads(answer.content)
            return calls(("get_config", {}), ("ping", {}))
        seen["last"] = {p.tool_name: p.content for p in returns(messages)}
        header, total = seen["sql"]["output"].split()  # DuckDB's CSV: a header, a row
        assert header == "total"
        return ModelResponse(parts=[TextPart(f"The open orders total {total}.")])

    agent = Agent(FunctionModel(model), capabilities=[capability])
    for name in scenario.PARALLEL + ("get_config",):
        agent.tool_plain(name=name)(lambda name=name: scenario.TOOLS[name])
    agent.tool_plain(name="ping")(lambda: small)
    return agent


@pytest.mark.docker
def test_the_scenario_in_a_real_sandbox(docker_harness: Harness) -> None:
    scenario.check_sizes()
    seen: dict[str, Any] = {}
    capability = Spillbox(docker_harness, task_id="pai", retention=Retention(redact=True))
    result = scenario_agent(capability, seen).run_sync("What do the open orders total?")

    assert {"sandbox_exec", "read_artifact", "list_artifacts"} <= set(seen["tools"])
    step = seen["step"]
    orders, users = scenario.notice_of(step["list_orders"]), scenario.notice_of(step["list_users"])
    assert orders is not None and users is not None  # 8k per call, then 5.6k by the aggregate
    assert step["list_events"] == scenario.EVENTS  # 4.5k stays, as the tool gave it
    assert sum(scenario.tokens(text) for text in step.values()) <= 10_000
    assert "read_artifact" in orders["hint"] and "sandbox_exec" in orders["hint"]
    assert seen["page"]["items"][0] == json.loads(scenario.ORDERS)[0]
    assert seen["sql"]["output"].split() == ["total", str(scenario.OPEN_TOTAL)]
    assert result.output == f"The open orders total {scenario.OPEN_TOTAL}."

    assert scenario.SECRET not in seen["last"]["get_config"]
    assert seen["last"]["ping"] is seen["small"]  # the very object the tool returned

    task = docker_harness.existing("pai")
    stored = {row.tool: task.read(row) for row in task.artifacts()}
    assert stored["list_orders"] == scenario.ORDERS.encode()
    assert stored["list_users"] == scenario.USERS.encode()


@pytest.fixture
def harness(home: Path) -> Iterator[Harness]:
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        yield harness


def run_turn(
    harness: Harness, tools: dict[str, Any], sent: list[Any] | None = None, **capability: Any
) -> list[ToolReturnPart]:
    """One model turn calling every tool in tools at once; the tool returns the model got
    back (and in sent, if given, every part of that request)."""
    got: list[ToolReturnPart] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return calls(*((name, {}) for name in tools))
        got.extend(returns(messages))
        if sent is not None:
            sent.extend(messages[-1].parts)
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), capabilities=[Spillbox(harness, **capability)])
    for name, tool in tools.items():
        agent.tool_plain(name=name)(tool)
    agent.run_sync("go")
    return got


def test_structured_results_are_gated_as_the_json_the_model_sees(harness: Harness) -> None:
    big = {"rows": json.loads(scenario.ORDERS)}
    image = BinaryContent(data=b"\x89PNG\r\n\x1a\n", media_type="image/png")
    got = run_turn(harness, {"records": lambda: big, "chart": lambda: image})
    records, chart = got
    assert scenario.notice_of(records.content) is not None
    assert chart.content is image  # an image passes untouched, uncounted
    task = harness.existing(next(iter(harness.tasks())))
    [row] = task.artifacts()
    assert json.loads(task.read(row)) == big


def test_a_tool_return_keeps_its_files_and_its_content_is_redacted(harness: Harness) -> None:
    image = BinaryContent(data=b"\x89PNG\r\n\x1a\n", media_type="image/png")

    def report() -> ToolReturn[Any]:
        return ToolReturn(
            return_value=[scenario.ORDERS, image],
            content=[f"key {scenario.SECRET}", image],
            metadata={"kept": True},
        )

    sent: list[Any] = []
    got = run_turn(harness, {"report": report}, sent, retention=Retention(redact=True))
    [part] = got
    text, file = part.content
    assert scenario.notice_of(text) is not None and file is image
    assert part.metadata == {"kept": True}
    [prompt] = [p for p in sent if isinstance(p, UserPromptPart)]  # the ToolReturn's content
    said, shown = prompt.content
    assert said.startswith("key ") and scenario.SECRET not in said and shown is image


def test_a_call_that_retries_leaves_its_step(harness: Harness) -> None:
    """A ModelRetry's call never submits: the step's other results are admitted without it
    (Steps.withdraw), and the model gets the retry and the other results."""

    def flaky() -> str:
        raise ModelRetry("try again with a filter")

    got = run_turn(harness, {"list_orders": lambda: scenario.ORDERS, "flaky": flaky})
    by_tool = {p.tool_name: p for p in got}
    assert scenario.notice_of(by_tool["list_orders"].content) is not None
    assert by_tool["flaky"].outcome == "retried"


def test_a_conversation_is_one_task_and_the_task_id_can_be_chosen(harness: Harness) -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if isinstance(messages[-1], ModelRequest) and returns(messages):
            return ModelResponse(parts=[TextPart("done")])
        turn = len([m for m in messages if isinstance(m, ModelResponse)])
        return ModelResponse(parts=[ToolCallPart("list_orders", {}, f"orders-{turn}")])

    agent = Agent(FunctionModel(model), capabilities=[Spillbox(harness)])
    agent.tool_plain(name="list_orders")(lambda: scenario.ORDERS)
    first = agent.run_sync("go")
    second = agent.run_sync("again", message_history=first.all_messages())
    [task_id] = harness.tasks()
    assert task_id == first.conversation_id == second.conversation_id
    # The same payload again, in the same task: the one artifact it already has.
    notices = [
        scenario.notice_of(part.content)
        for message in second.all_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    [row] = harness.existing(task_id).artifacts()
    assert [n["path"] for n in notices if n] == [row.path, row.path]

    chosen = Agent(FunctionModel(model), capabilities=[Spillbox(harness, task_id=lambda c: "mine")])
    chosen.tool_plain(name="list_orders")(lambda: scenario.ORDERS)
    chosen.run_sync("go")
    assert sorted(harness.tasks()) == sorted([task_id, "mine"])


TOY_SERVER = Path(__file__).parents[1] / "mcp" / "toy_server.py"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
EVENTS_TEXT = "events:\n" + scenario.EVENTS
"""4.5k tokens of text: PydanticAI's MCP client parses a text that starts as JSON does (and
the model is sent it compact, 3.7k), not this one."""


def test_an_mcp_toolsets_results_share_the_step_and_the_gate(harness: Harness) -> None:
    """MCP tools (PydanticAI's MCPToolset over the toy server) pass the same hooks as function
    tools: one step holds both, the aggregate rule spans them, and an MCP image passes."""
    from fastmcp.client import Client
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai.mcp import MCPToolset

    image = {"type": "image", "data": base64.b64encode(PNG).decode(), "mimeType": "image/png"}
    got: list[ToolReturnPart] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:
            got.extend(returns(messages))
            return ModelResponse(parts=[TextPart("done")])
        return ModelResponse(
            parts=[
                ToolCallPart("echo", {"text": scenario.ORDERS}, "orders"),
                ToolCallPart("list_users", {}, "users"),
                ToolCallPart("echo", {"text": EVENTS_TEXT}, "events"),
                ToolCallPart("result", {"result": {"content": [image]}}, "image"),
            ]
        )

    toolset = MCPToolset(Client(StdioTransport(command=sys.executable, args=[str(TOY_SERVER)])))
    agent = Agent(FunctionModel(model), toolsets=[toolset], capabilities=[Spillbox(harness)])
    agent.tool_plain(name="list_users")(lambda: scenario.USERS)
    agent.run_sync("go")

    by_call = {p.tool_call_id: p.content for p in got}
    orders, users = scenario.notice_of(by_call["orders"]), scenario.notice_of(by_call["users"])
    assert orders is not None and orders["reason"].startswith("per_call")
    # The users' 5.6k is offloaded only in a step with the MCP tool's 4.5k events.
    assert users is not None and users["reason"].startswith("aggregate")
    assert by_call["events"] == EVENTS_TEXT
    assert isinstance(by_call["image"], BinaryContent) and by_call["image"].data == PNG
    task = harness.existing(next(iter(harness.tasks())))
    stored = {row.tool: task.read(row) for row in task.artifacts()}
    assert json.loads(stored["echo"]) == json.loads(scenario.ORDERS)
