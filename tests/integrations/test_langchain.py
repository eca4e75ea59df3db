"""spillbox in LangChain's create_agent and in a bare LangGraph graph (issue 26, LangChain):
the shared scenario (framework_scenario) driven by a fake chat model whose every turn is made
from the messages it received, sync (threads) and async (tasks), under runc and gVisor."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from framework_scenario import (
    EVENTS,
    OPEN_TOTAL,
    ORDERS,
    PARALLEL,
    SECRET,
    SMALL,
    TOOLS,
    check_sizes,
    notice_of,
    open_total_sql,
)
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from spillbox import Harness
from spillbox.integrations.langchain import TASK_ID_KEY, SpillboxMiddleware
from spillbox.retention import Retention

pytest_plugins = ["framework_fixtures"]  # the runtime and docker_harness fixtures

pytestmark = pytest.mark.docker

DOT = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
    "AAAABJRU5ErkJggg=="
)
"""A PNG of one pixel, as a script's chart."""


class ScriptedChat(GenericFakeChatModel):
    """langchain_core's fake chat model, each turn made by `script` from the messages the
    model was given (which it keeps in `received`); bind_tools keeps the tools' names."""

    script: Callable[[Sequence[BaseMessage]], AIMessage]
    received: list[list[BaseMessage]] = []
    bound: list[str] = []

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.received.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.script(messages))])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChat:  # type: ignore[override]
        self.bound = [t.name if isinstance(t, BaseTool) else t["name"] for t in tools]
        return self


def text_of(message: ToolMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(b if isinstance(b, str) else str(b.get("text", "")) for b in content)


def call(name: str, call_id: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


def script(messages: Sequence[BaseMessage]) -> AIMessage:
    """The model: three parallel lists; then read back the offloaded orders, with the config
    and a ping; then the SQL its notice suggests; then the sum that query printed."""
    got = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    if "c1" not in got:
        calls = [call(name, f"c{i}") for i, name in enumerate(PARALLEL, 1)]
        return AIMessage(content="", id="turn-1", tool_calls=calls)
    notice = notice_of(text_of(got["c1"]))
    assert notice is not None, text_of(got["c1"])
    if "c4" not in got:
        read = call("read_artifact", "c4", path=notice["path"], artifact_id=None, cursor=None)
        calls = [read, call("get_config", "c5"), call("ping", "c6")]
        return AIMessage(content="", id="turn-2", tool_calls=calls)
    if "c7" not in got:
        sql = call("sandbox_exec", "c7", lang="sql", code=open_total_sql(notice), artifact=None)
        return AIMessage(content="", id="turn-3", tool_calls=[sql])
    printed = json.loads(text_of(got["c7"]))["output"]
    return AIMessage(content=re.findall(r"\d+", printed)[-1], id="turn-4")


def user_tools(is_async: bool) -> list[BaseTool]:
    def tool(name: str, text: str) -> BaseTool:
        async def arun() -> str:
            await asyncio.sleep(0)
            return text

        if is_async:
            return StructuredTool.from_function(coroutine=arun, name=name, description=name)
        return StructuredTool.from_function(func=lambda: text, name=name, description=name)

    return [tool(name, text) for name, text in TOOLS.items()]


def agent_graph(spillbox: SpillboxMiddleware, model: ScriptedChat, is_async: bool) -> Any:
    return create_agent(model, user_tools(is_async), middleware=[spillbox])


def bare_graph(spillbox: SpillboxMiddleware, model: ScriptedChat, is_async: bool) -> Any:
    """A StateGraph of a model node and a ToolNode wrapped by spillbox's callables."""
    tools = [*user_tools(is_async), *spillbox.tools]
    bound = model.bind_tools(tools)

    def think(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    async def athink(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    node = ToolNode(
        tools, wrap_tool_call=spillbox.wrap_tool_call, awrap_tool_call=spillbox.awrap_tool_call
    )
    graph = StateGraph(MessagesState)
    graph.add_node("model", athink if is_async else think)
    graph.add_node("tools", node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("build", [agent_graph, bare_graph], ids=["create_agent", "stategraph"])
def test_the_scenario(docker_harness: Harness, build: Callable[..., Any], is_async: bool) -> None:
    check_sizes()
    spillbox = SpillboxMiddleware(docker_harness, retention=Retention(redact=True))
    model = ScriptedChat(messages=iter(()), script=script)
    graph = build(spillbox, model, is_async)
    thread = f"{build.__name__}-{'async' if is_async else 'sync'}"
    config: Any = {"configurable": {"thread_id": thread}}
    prompt = {"messages": [HumanMessage("What do the open orders add up to?")]}
    if is_async:
        final = asyncio.run(graph.ainvoke(prompt, config))
    else:
        final = graph.invoke(prompt, config)
    if build is bare_graph:
        spillbox.end(config)
    try:
        check_what_the_model_saw(model, docker_harness, thread)
        assert final["messages"][-1].content == str(OPEN_TOTAL)
        row = docker_harness.catalog.task(thread)
        assert row is not None and row.closed_at is not None  # the run's end closed it
    finally:
        docker_harness.remove(thread)


def check_what_the_model_saw(model: ScriptedChat, harness: Harness, task_id: str) -> None:
    assert {"sandbox_exec", "read_artifact", "list_artifacts"} <= set(model.bound)
    assert len(model.received) == 4
    got = {m.tool_call_id: m for m in model.received[-1] if isinstance(m, ToolMessage)}
    orders, users, events = (notice_of(text_of(got[c])) for c in ("c1", "c2", "c3"))
    assert orders is not None and "per_call" in orders["reason"], text_of(got["c1"])
    assert users is not None and "aggregate" in users["reason"], text_of(got["c2"])
    assert events is None and got["c3"].content == EVENTS
    assert got["c6"].content == SMALL
    task = harness.existing(task_id)
    row = task.artifact(orders["path"])
    assert task.read(row) == ORDERS.encode()  # byte-exact
    page = json.loads(text_of(got["c4"]))
    assert page["items"][0] == json.loads(ORDERS)[0], page
    assert str(OPEN_TOTAL) in text_of(got["c7"])
    seen = "".join(str(m.content) for turn in model.received for m in turn)
    assert SECRET not in seen and "eu-west-1" in text_of(got["c5"])


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Harness]:
    """A harness without a sandbox, for what needs no code mode."""
    with Harness(sandbox="none", home=tmp_path, gc_interval=-1) as harness:
        yield harness


def test_a_result_left_inline_is_the_very_message_the_tool_gave(local: Harness) -> None:
    """An inline result comes back as the object the tool returned; a content-block list
    (a plain string among its blocks) with an image is counted by its text, and the image
    stays where it was."""
    spillbox = SpillboxMiddleware(local)
    node = ToolNode(user_tools(False), wrap_tool_call=spillbox.wrap_tool_call)
    image = {"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"}
    small = ToolMessage(content=SMALL, tool_call_id="s1", name="ping")
    blocks = ToolMessage(content=["see:", image, ORDERS], tool_call_id="s2", name="list_orders")
    state = {TASK_ID_KEY: "inline", "messages": []}
    try:
        assert spillbox.wrap_tool_call(_request(node, small, state), lambda _: small) is small
        out = spillbox.wrap_tool_call(_request(node, blocks, state), lambda _: blocks)
        assert isinstance(out, ToolMessage) and isinstance(out.content, list)
        assert image in out.content and notice_of(text_of(out)) is not None
        row = local.existing("inline").artifact("s2")
        assert local.existing("inline").read(row) == ("see:" + ORDERS).encode()
    finally:
        spillbox.close()


def test_a_run_is_a_task(local: Harness) -> None:
    """create_agent's run is one task: the thread's, the configurable spillbox_task_id
    where given, else one of its own per run; each is closed when its run ends."""

    def ping_once(messages: Sequence[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return AIMessage(content="done")
        return AIMessage(content="", id="turn-1", tool_calls=[call("ping", "p1")])

    spillbox = SpillboxMiddleware(local)
    model = ScriptedChat(messages=iter(()), script=ping_once)
    agent = create_agent(model, user_tools(False), middleware=[spillbox])
    prompt = {"messages": [HumanMessage("ping")]}
    configs: list[Any] = [
        {"configurable": {"thread_id": "thread-1"}},
        {"configurable": {"thread_id": "thread-2", TASK_ID_KEY: "mine"}},
        {},
        {},
    ]
    for config in configs:
        assert agent.invoke(prompt, config)["messages"][-1].content == "done"
    tasks = local.tasks()
    assert "thread-1" in tasks and "mine" in tasks and "thread-2" not in tasks
    assert len(tasks) == 4  # each run without a thread its own
    assert all(local.catalog.task(t).closed_at is not None for t in tasks)  # type: ignore[union-attr]


def test_a_command_answering_the_call_is_gated_through_its_tool_message(local: Harness) -> None:
    spillbox = SpillboxMiddleware(local)
    node = ToolNode(user_tools(False), wrap_tool_call=spillbox.wrap_tool_call)
    message = ToolMessage(content=ORDERS, tool_call_id="k1", name="list_orders")
    command = Command(update={"messages": [message], "seen": 1})
    state = {TASK_ID_KEY: "command", "messages": []}
    try:
        out = spillbox.wrap_tool_call(_request(node, message, state), lambda _: command)
        assert isinstance(out, Command) and isinstance(out.update, dict)
        assert out.update["seen"] == 1
        [gated] = out.update["messages"]
        assert notice_of(text_of(gated)) is not None and gated.tool_call_id == "k1"
    finally:
        spillbox.close()


def test_a_scripts_chart_comes_back_as_an_image_block(docker_harness: Harness) -> None:
    spillbox = SpillboxMiddleware(docker_harness)
    [exec_tool] = [t for t in spillbox.tools if t.name == "sandbox_exec"]
    code = (
        f"import base64\nopen('/sandbox/outputs/dot.png', 'wb').write(base64.b64decode({DOT!r}))"
        "\nprint('drawn')"
    )
    args = {"lang": "python", "code": code, "artifact": None}
    state = {TASK_ID_KEY: "chart", "messages": []}
    try:
        sandbox_exec = call("sandbox_exec", "x1", **args)
        request = _request(ToolNode(spillbox.tools), None, state, sandbox_exec)
        out = spillbox.wrap_tool_call(request, lambda _: pytest.fail("ours run in the wrapper"))
        assert isinstance(out, ToolMessage) and isinstance(out.content, list), out
        [text, image] = out.content
        assert isinstance(text, dict) and "drawn" in json.loads(text["text"])["output"]
        assert isinstance(image, dict) and image["type"] == "image"
        assert image["mime_type"] == "image/png" and image["base64"].startswith("iVBOR")
        assert request.tool is exec_tool
    finally:
        spillbox.close()
        docker_harness.remove("chart")


def test_the_example_runs_offline(sandbox_image: str, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/langchain_agent.py, run in this process (its imports are loaded already)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "langchain_agent.py"
    spec = importlib.util.spec_from_file_location("langchain_agent_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main()
    printed = capsys.readouterr().out
    assert "[spillbox offloaded v1]" in printed
    assert printed.strip().endswith("The open orders add up to 27900.")


def _request(
    node: ToolNode,
    message: ToolMessage | None,
    state: dict[str, Any],
    tool_call: dict[str, Any] | None = None,
) -> Any:
    from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime

    if tool_call is None:
        assert message is not None
        tool_call = call(str(message.name), message.tool_call_id)
    runtime = ToolRuntime(
        state=state,
        context=None,
        config={"configurable": {}},
        stream_writer=lambda _: None,
        tool_call_id=tool_call["id"],
        store=None,
    )
    return ToolCallRequest(tool_call, node.tools_by_name[tool_call["name"]], state, runtime)
