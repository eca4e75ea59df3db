"""spillbox inside the OpenAI Agents SDK (issue 26): the real SDK from PyPI driven by a model of
this test's own (a Model subclass that answers from the input it received), the tool outputs
gated by SpillboxInputFilter (RunConfig.call_model_input_filter) and spillbox's tools offered
as the agent's FunctionTools."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    FunctionTool,
    Model,
    ModelResponse,
    RunConfig,
    Runner,
    SQLiteSession,
)
from agents.run_config import CallModelData, ModelInputData
from agents.usage import Usage
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
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from spillbox import Harness, Retention
from spillbox.integrations.openai_agents import (
    TASK_PREFIX,
    SpillboxInputFilter,
    SpillboxRun,
    run,
)

pytest_plugins = ["framework_fixtures"]  # the runtime and docker_harness fixtures

Turn = Callable[[dict[str, Any]], list[Any]]
"""What the model does next, from the outputs it received (call id -> output)."""

NO_TRACING = RunConfig(tracing_disabled=True)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the SDK runs on asyncio


def call(call_id: str, name: str, **arguments: Any) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=call_id, name=name, arguments=json.dumps(arguments)
    )


def answer(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


class InputModel(Model):
    """A model that needs no network: each turn is `turn(outputs it received)`; it keeps every
    input it received (as received) and the names of the tools it was offered."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.inputs: list[list[Any]] = []
        self.tools: list[str] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **kw: Any,
    ) -> ModelResponse:
        items = [] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        self.tools = [tool.name for tool in tools]
        outputs = copy.deepcopy(self.outputs(len(self.inputs) - 1))
        return ModelResponse(output=self.turn(outputs), usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kw: Any) -> AsyncIterator[Any]:
        response = await self.get_response(*args, **kw)
        yield ResponseCompletedEvent(
            type="response.completed",
            sequence_number=0,
            response=Response(
                id="r",
                created_at=0,
                model="input-model",
                object="response",
                output=response.output,
                tool_choice="auto",
                tools=[],
                parallel_tool_calls=True,
            ),
        )

    def outputs(self, index: int) -> dict[str, Any]:
        """The tool outputs of the index-th model call, by call id."""
        return {
            item["call_id"]: item["output"]
            for item in self.inputs[index]
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        }


class Spy:
    """A run config's own filter (it runs before spillbox's): keeps each model input as the
    SDK gave it."""

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        self.inputs.append(list(data.model_data.input))
        return data.model_data


def returning(name: str, text: str) -> FunctionTool:
    """A user tool that returns text exactly."""

    async def invoke(context: Any, arguments: str) -> str:
        return text

    return FunctionTool(
        name=name,
        description=f"Returns the {name.removeprefix('list_')}.",
        params_json_schema={
            "type": "object",
            "properties": {},
            "required": [],
            "additionalProperties": False,
        },
        on_invoke_tool=invoke,
    )


def user_tools() -> list[FunctionTool]:
    return [returning(name, text) for name, text in TOOLS.items()]


def parallel_calls() -> list[Any]:
    return [call(f"c-{name}", name) for name in PARALLEL]


# The scenario, in a real Docker sandbox under runc and gVisor


def scenario(outputs: dict[str, Any]) -> list[Any]:
    """Three parallel calls; then read the orders back, get the config and ping; then the SQL
    the orders' notice suggests; then the SQL's answer."""
    if "c-sql" in outputs:
        body = json.loads(outputs["c-sql"])
        return [answer(body["output"].strip().splitlines()[-1])]
    notice = notice_of(outputs["c-list_orders"]) if outputs else None
    if notice is None:
        return parallel_calls()
    if "c-read" not in outputs:
        path = notice["path"]
        empty = dict.fromkeys(("artifact_id", "cursor", "records", "limit", "start", "fields"))
        return [
            call("c-read", "read_artifact", path=path, **empty),
            call("c-get_config", "get_config"),
            call("c-ping", "ping"),
        ]
    return [
        call(
            "c-sql",
            "sandbox_exec",
            lang="sql",
            code=open_total_sql(notice),
            artifact=None,
            timeout=60,
            session=None,
            reset_session=None,
        )
    ]


@pytest.mark.docker
async def test_the_scenario_gates_a_step_and_answers_with_sql(docker_harness: Harness) -> None:
    check_sizes()
    model = InputModel(scenario)
    agent = Agent(name="analyst", instructions="Answer from the tools.", model=model)
    agent = agent.clone(tools=user_tools())
    spy = Spy()
    result = await run(
        docker_harness,
        agent,
        "What do the open orders amount to?",
        task_id="agents-scenario",
        retention=Retention(redact=True),
        run_config=RunConfig(tracing_disabled=True, call_model_input_filter=spy),
    )

    assert result.final_output == str(OPEN_TOTAL)  # the exact answer, from the SQL
    assert {"sandbox_exec", "read_artifact", "list_artifacts"} <= set(model.tools)
    step = model.outputs(1)
    orders, users = notice_of(step["c-list_orders"]), notice_of(step["c-list_users"])
    assert orders is not None and orders["reason"].startswith("per_call")
    assert users is not None and users["reason"].startswith("aggregate")
    assert step["c-list_events"] == EVENTS  # what fits stays inline, exactly
    assert "read_artifact" in orders["hint"] and "sandbox_exec" in orders["hint"]
    # Read back, inline (a page is never offloaded again)
    page = json.loads(model.outputs(2)["c-read"])
    assert page["items"] == json.loads(ORDERS)[: page["returned"]]
    # The secret never reached the model; the small result is the very item the SDK gave
    assert (
        SECRET not in json.dumps(model.inputs) and "[REDACTED:" in model.outputs(2)["c-get_config"]
    )
    assert CONFIG != model.outputs(2)["c-get_config"]
    [given] = [i for i in spy.inputs[2] if i.get("call_id") == "c-ping" and "output" in i]
    [received] = [i for i in model.inputs[2] if i.get("call_id") == "c-ping" and "output" in i]
    assert received is given and received["output"] == SMALL
    # Gated once: later model calls get the same notices; one artifact per payload
    for later in (2, 3):
        assert model.outputs(later)["c-list_orders"] == step["c-list_orders"]
        assert model.outputs(later)["c-list_users"] == step["c-list_users"]
    task = docker_harness.existing("agents-scenario")
    rows = {row.call_id: row for row in task.artifacts()}
    assert task.read(rows["c-list_orders"]) == ORDERS.encode()  # byte-exact
    assert task.read(rows["c-list_users"]) == USERS.encode()
    assert [row.call_id for row in task.artifacts()].count("c-list_orders") == 1
    assert docker_harness.catalog.task("agents-scenario").state == "closed"  # type: ignore[union-attr]


# The mapping and the shapes, with no sandbox (store only)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with Harness(sandbox="none", home=tmp_path / "home", environ={}, gc_interval=-1) as harness:
        yield harness


def calls_then_answer(outputs: dict[str, Any]) -> list[Any]:
    return [answer(f"{len(outputs)} outputs")] if outputs else parallel_calls()


def agent_of(model: Model, tools: list[FunctionTool] | None = None) -> Agent[Any]:
    return Agent(name="a", model=model, tools=user_tools() if tools is None else tools)


async def test_a_session_is_one_task_across_runs(harness: Harness) -> None:
    session = SQLiteSession("conversation-7")
    first = InputModel(calls_then_answer)
    await run(harness, agent_of(first), "list them", session=session, run_config=NO_TRACING)
    second = InputModel(calls_then_answer)
    result = await run(harness, agent_of(second), "again?", session=session, run_config=NO_TRACING)

    assert result.final_output == "3 outputs"
    # The session's history holds the raw outputs; the next run's model gets them gated again
    history = second.outputs(0)
    assert history["c-list_orders"] == first.outputs(1)["c-list_orders"]
    assert notice_of(history["c-list_orders"]) is not None
    assert history["c-list_events"] == EVENTS
    assert harness.tasks() == ["conversation-7"]
    rows = harness.existing("conversation-7").artifacts()
    assert sorted(row.call_id for row in rows) == ["c-list_orders", "c-list_users"]


async def test_each_run_without_a_session_is_a_task_of_its_own(harness: Harness) -> None:
    for _ in range(2):
        await run(harness, agent_of(InputModel(calls_then_answer)), "go", run_config=NO_TRACING)
    tasks = harness.tasks()
    assert len(tasks) == 2 and all(task.startswith(TASK_PREFIX) for task in tasks)
    assert {harness.catalog.task(t).state for t in tasks} == {"closed"}  # type: ignore[union-attr]
    # A task id of one's own; its retention applies when the run ends
    await run(
        harness,
        agent_of(InputModel(calls_then_answer)),
        "go",
        task_id="mine",
        retention=Retention(keep_after_close=0),
        run_config=NO_TRACING,
    )
    assert "mine" not in harness.tasks()
    assert harness.catalog.task("mine").state == "deleted"  # type: ignore[union-attr]


def model_input(items: list[Any]) -> CallModelData[Any]:
    return CallModelData(
        model_data=ModelInputData(input=items, instructions="i"),
        agent=Agent(name="a"),
        context=None,
    )


async def test_every_kind_of_tool_output_is_gated_in_its_own_shape(harness: Harness) -> None:
    image = {
        "type": "input_image",
        "image_url": "data:image/png;base64,iVBORw0KGgo=",
        "detail": "auto",
    }
    items: list[Any] = [
        {"role": "user", "content": "go"},
        {"type": "shell_call", "call_id": "s1", "action": {"commands": ["cat orders"]}},
        {"type": "custom_tool_call", "call_id": "k1", "name": "grep", "input": "x"},
        {"type": "function_call", "call_id": "f1", "name": "chart", "arguments": "{}"},
        {"type": "function_call", "call_id": "f3", "name": "events", "arguments": "{}"},
        {
            "type": "shell_call_output",
            "call_id": "s1",
            "output": [
                {"stdout": ORDERS, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}
            ],
        },
        {"type": "custom_tool_call_output", "call_id": "k1", "output": SMALL},
        {
            "type": "function_call_output",
            "call_id": "f1",
            "output": [{"type": "input_text", "text": USERS}, image],
        },
        {"type": "function_call_output", "call_id": "f3", "output": EVENTS},
        {
            "type": "mcp_call",
            "id": "m1",
            "name": "fetch",
            "server_label": "web",
            "arguments": "{}",
            "output": ORDERS,
        },
    ]
    with harness.task("shapes") as task:
        gate = SpillboxInputFilter(task)
        first = (await gate(model_input(list(items)))).input
        shell, custom, chart, events, mcp = first[5:]
        [chunk] = shell["output"]  # still a shell output: the notice as its stdout
        assert notice_of(chunk["stdout"])["tool"] == "shell" and chunk["outcome"]["exit_code"] == 0  # type: ignore[index]
        assert custom is items[6] and events is items[8]  # inline: the very items
        [text, kept] = chart["output"]  # the text became the notice, the image stayed
        assert notice_of(text["text"])["reason"].startswith("aggregate") and kept == image  # type: ignore[index]
        assert notice_of(mcp["output"])["tool"] == "fetch"  # type: ignore[index]
        assert mcp["server_label"] == "web"
        stored = len(task.artifacts())
        # The next model call: the same outputs again, and a new turn's
        more = [
            *items,
            {"type": "function_call", "call_id": "f2", "name": "ping", "arguments": "{}"},
        ]
        more.append({"type": "function_call_output", "call_id": "f2", "output": ORDERS + "\n"})
        second = (await gate(model_input(more))).input
        assert second[5:10] == first[5:10] and second[6] is items[6]
        assert notice_of(second[11]["output"])["reason"].startswith("per_call")  # type: ignore[index]
        assert len(task.artifacts()) == stored + 1  # only the new turn's output


async def test_each_turn_in_an_input_is_a_step_of_its_own(harness: Harness) -> None:
    def turn(call_id: str, text: str) -> list[Any]:
        return [
            {"type": "function_call", "call_id": call_id, "name": call_id, "arguments": "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": text},
        ]

    with harness.task("turns") as task:
        gate = SpillboxInputFilter(task)
        apart = (await gate(model_input([*turn("u", USERS), *turn("e", EVENTS)]))).input
        assert [item["output"] for item in apart[1::2]] == [USERS, EVENTS]  # 5.6k, then 4.5k
        together = [
            {"type": "function_call", "call_id": "u2", "name": "u", "arguments": "{}"},
            {"type": "function_call", "call_id": "e2", "name": "e", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "u2", "output": USERS},
            {"type": "function_call_output", "call_id": "e2", "output": EVENTS},
        ]
        one = (await gate(model_input(together))).input
        assert notice_of(one[2]["output"])["reason"].startswith("aggregate")  # type: ignore[index]
        assert one[3]["output"] == EVENTS


async def test_spillbox_tools_are_named_around_the_agents_own(harness: Harness) -> None:
    agent = agent_of(InputModel(calls_then_answer), [returning("read_artifact", "mine")])
    async with SpillboxRun.open(harness, agent, task_id="names") as spill:
        names = [tool.name for tool in spill.tools]
        assert names == ["spillbox_read_artifact", "list_artifacts", "search_artifacts"]
        assert [t.name for t in spill.agent.tools] == ["read_artifact", *names]
        assert [t.name for t in agent.tools] == ["read_artifact"]  # the agent given is unchanged
        items = [
            {"type": "function_call", "call_id": "o", "name": "list_orders", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "o", "output": ORDERS},
        ]
        gated = (await spill.input_filter(model_input(items))).input
        hint = notice_of(gated[1]["output"])["hint"]  # type: ignore[index]
        assert hint.startswith("spillbox_read_artifact ")


# An MCP server's tools, through the SDK's own MCP client

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwAB"
    "BAEAwS2OUAAAAABJRU5ErkJggg=="
)
TOY_SERVER = Path(__file__).parents[1] / "mcp" / "toy_server.py"


def mcp_turns(outputs: dict[str, Any]) -> list[Any]:
    if outputs:
        return [answer("done")]
    hostile = {
        "content": [
            {"type": "text", "text": f"config: {CONFIG}"},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
        ]
    }
    return [
        call("m-wide", "wide", rows=400),
        call("m-result", "result", result=hostile),
        call("m-echo", "echo", text=SMALL),
    ]


async def test_an_mcp_servers_results_are_gated_as_one_step(harness: Harness) -> None:
    from agents.mcp import MCPServerStdio

    params = {"command": sys.executable, "args": [str(TOY_SERVER)]}
    model = InputModel(mcp_turns)
    spy = Spy()
    async with MCPServerStdio(params, name="toy", use_structured_content=True) as server:
        agent = Agent(name="a", model=model, mcp_servers=[server])
        config = RunConfig(tracing_disabled=True, call_model_input_filter=spy)
        await run(
            harness, agent, "go", task_id="mcp", retention=Retention(redact=True), run_config=config
        )

    raw = {i["call_id"]: i for i in spy.inputs[1] if i.get("type") == "function_call_output"}
    step = model.outputs(1)
    wide = notice_of(step["m-wide"])  # the structured rows, offloaded
    assert wide is not None and wide["tool"] == "wide"
    task = harness.existing("mcp")
    assert task.read("m-wide") == raw["m-wide"]["output"].encode()  # byte-exact
    text, image = step["m-result"]  # the secret redacted, the image kept
    assert SECRET not in text["text"] and "[REDACTED:" in text["text"]
    assert image == raw["m-result"]["output"][1]
    [echo] = [i for i in model.inputs[1] if i.get("call_id") == "m-echo" and "output" in i]
    assert echo is raw["m-echo"]


async def test_a_streamed_run_is_gated_the_same(harness: Harness) -> None:
    model = InputModel(calls_then_answer)
    async with SpillboxRun.open(harness, agent_of(model), task_id="streamed") as spill:
        streamed = Runner.run_streamed(spill.agent, "go", run_config=spill.run_config(NO_TRACING))
        async for _ in streamed.stream_events():
            pass
    assert streamed.final_output == "3 outputs"
    assert notice_of(model.outputs(1)["c-list_orders"]) is not None
    assert model.outputs(1)["c-list_events"] == EVENTS
