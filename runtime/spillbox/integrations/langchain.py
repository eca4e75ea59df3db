"""spillbox in LangChain 1.x (`create_agent`) and LangGraph (`ToolNode`).

    spillbox = SpillboxMiddleware(Harness(sandbox="docker"), retention=Retention(redact=True))
    agent = create_agent(model, tools, middleware=[spillbox])   # spillbox's tools come along
    agent.invoke({"messages": [...]}, {"configurable": {"thread_id": "t1"}})

    # a bare LangGraph graph: spillbox's tools beside yours, its wrappers on the ToolNode
    node = ToolNode([*tools, *spillbox.tools], wrap_tool_call=spillbox.wrap_tool_call,
                    awrap_tool_call=spillbox.awrap_tool_call)
    graph.invoke(state, config); spillbox.end(config)          # the run's task ends

Every ToolMessage a tool returns passes the run's task's gate (Task.admit) before the model
sees it: left inline it is the very ToolMessage the tool gave; offloaded, withheld or refused,
a copy holding the notice in place of its text (its images stay); redacted, a copy holding
the redacted text. A content-block list is counted as the core counts one
(adapters.counted_content: text blocks, and every block besides images as JSON).

A step is the AIMessage whose tool calls these are: its id is the step's key, its calls not
yet answered are how many results the step waits for (spillbox.steps). Both ToolNode and
create_agent run a turn's calls at once (threads for sync tools, tasks for async), so the
turn's results are gated together. A task is the run's: the configurable "spillbox_task_id",
else the LangGraph thread_id, else an id of its own per run (create_agent; a bare ToolNode
uses one per middleware); create_agent's run ends (Task.close(): retention applies) in the
middleware's after_agent, a bare graph's at end(config) or close().
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Awaitable, Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NotRequired

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState
    from langchain.agents.middleware.types import PrivateStateAttr
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool
    from langgraph.config import get_config
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.runtime import Runtime
    from langgraph.types import Command
except ImportError as e:
    raise ImportError(
        "spillbox.integrations.langchain needs langchain and langgraph: "
        "pip install 'spillbox[langchain]'"
    ) from e

import anyio.to_thread

from spillbox.adapters import counted_content, gated_content
from spillbox.protocols import ClosableTask, TaskOpener
from spillbox.retention import Retention
from spillbox.steps import Steps
from spillbox.tools import ToolOutput, Toolset, specs_of, tool_names
from spillbox.types import Admitted, ToolResult

TASK_ID_KEY = "spillbox_task_id"
"""The configurable key that names a run's task, and the agent state's key that keeps it."""

Outcome = ToolMessage | Command[Any]


class SpillboxState(AgentState[Any]):
    """The agent state with the run's task id (kept from the model, private to the agent)."""

    spillbox_task_id: NotRequired[Annotated[str, PrivateStateAttr]]


class SpillboxTool(BaseTool):
    """One of spillbox's tools as a LangChain tool: its name and schema for the model; the
    call itself runs in the middleware's wrap_tool_call, against the run's task."""

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"{self.name} runs through SpillboxMiddleware: add the middleware to create_agent, "
            "or give ToolNode its wrap_tool_call and awrap_tool_call"
        )


@dataclass
class _Run:
    """What one run holds: its task, spillbox's tools on it, and its steps."""

    task: ClosableTask
    toolset: Toolset
    steps: Steps


class SpillboxMiddleware(AgentMiddleware[SpillboxState, Any, Any]):
    """Gates every tool result of a LangChain agent (or LangGraph ToolNode) through one
    spillbox task per run, and offers spillbox's tools.

    >>> spillbox = SpillboxMiddleware(harness)  # doctest: +SKIP
    >>> agent = create_agent(model, tools, middleware=[spillbox])  # doctest: +SKIP
    """

    state_schema = SpillboxState

    def __init__(
        self,
        harness: TaskOpener,
        *,
        retention: Retention | None = None,
        taken: Collection[str] = (),
    ) -> None:
        """retention: each run's task's policy (None: the harness's default).
        taken: the names of the agent's other tools; one of spillbox's with such a name is
        offered as spillbox_<name>."""
        super().__init__()
        self.harness = harness
        self.retention = retention
        self._taken = tuple(taken)
        self.tools = [
            SpillboxTool(
                name=spec.name, description=spec.description, args_schema=dict(spec.parameters)
            )
            for spec in specs_of(tool_names(harness.backend.languages, taken))
        ]
        self.default_task_id = f"langgraph-{uuid.uuid4().hex}"
        """The task of a bare graph's runs whose config names none (no thread_id)."""
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    # The run: opened before the agent, ended after it (or by end/close for a bare graph).

    def before_agent(self, state: SpillboxState, runtime: Runtime[Any]) -> dict[str, Any]:
        """Open the run's task and keep its id in the state, where the tool calls find it."""
        configurable = get_config().get("configurable") or {}
        task_id = str(
            configurable.get(TASK_ID_KEY)
            or state.get(TASK_ID_KEY)
            or configurable.get("thread_id")
            or f"langchain-{uuid.uuid4().hex}"
        )
        self._run(task_id)
        return {TASK_ID_KEY: task_id}

    def after_agent(self, state: SpillboxState, runtime: Runtime[Any]) -> None:
        """End the run's task: Task.close(), so its retention applies."""
        task_id = state.get("spillbox_task_id")
        if task_id is not None:
            self._end(task_id)

    def end(self, config: RunnableConfig) -> None:
        """End the task of a bare graph's run with this config: its retention applies."""
        self._end(self._task_id(None, config))

    def close(self) -> None:
        """End every run still open (one that failed before after_agent)."""
        with self._lock:
            runs, self._runs = list(self._runs.values()), {}
        for run in runs:
            run.task.close()

    def _run(self, task_id: str) -> _Run:
        with self._lock:
            run = self._runs.get(task_id)
            if run is None:
                task = self.harness.task(task_id, self.retention)
                run = _Run(task, Toolset(task, self._taken), Steps(task.admit))
                self._runs[task_id] = run
            return run

    def _end(self, task_id: str) -> None:
        with self._lock:
            run = self._runs.pop(task_id, None)
        if run is not None:
            run.task.close()

    def _task_id(self, state: Any, config: RunnableConfig) -> str:
        if isinstance(state, Mapping) and state.get(TASK_ID_KEY):
            return str(state[TASK_ID_KEY])
        configurable = config.get("configurable") or {}
        found = configurable.get(TASK_ID_KEY) or configurable.get("thread_id")
        return str(found) if found else self.default_task_id

    # The calls: each result joins its step; the step is gated as one.

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Outcome]
    ) -> Outcome:
        run = self._run(self._task_id(request.state, request.runtime.config))
        if isinstance(request.tool, SpillboxTool):
            output = run.toolset.call(request.tool_call["name"], request.tool_call["args"])
            outcome: Outcome = _message(request, output)
            offloadable = output.offloadable
        else:
            outcome, offloadable = handler(request), True
        gated = _Gated.of(request, outcome, offloadable)
        if gated is None:
            return outcome
        return gated.outcome(run.steps.submit_sync(gated.result, **gated.step))

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Outcome]]
    ) -> Outcome:
        task_id = self._task_id(request.state, request.runtime.config)
        # Opening a task reads and writes the catalog: not on the event loop.
        run = self._runs.get(task_id)
        if run is None:
            run = await anyio.to_thread.run_sync(self._run, task_id)
        if isinstance(request.tool, SpillboxTool):
            call = request.tool_call
            # In a worker thread: code mode blocks.
            output = await anyio.to_thread.run_sync(run.toolset.call, call["name"], call["args"])
            outcome: Outcome = _message(request, output)
            offloadable = output.offloadable
        else:
            outcome, offloadable = await handler(request), True
        gated = _Gated.of(request, outcome, offloadable)
        if gated is None:
            return outcome
        return gated.outcome(await run.steps.submit(gated.result, **gated.step))


@dataclass(frozen=True)
class _Gated:
    """One call's outcome on its way through the gate: the ToolMessage answering it, what
    the gate is given of it, and its step."""

    given: Outcome
    message: ToolMessage
    result: ToolResult
    step: dict[str, Any]
    """Steps.submit's step and expected."""

    @classmethod
    def of(cls, request: ToolCallRequest, outcome: Outcome, offloadable: bool) -> _Gated | None:
        """None for an outcome with no ToolMessage for this call (a Command that only
        updates state): it passes as it is."""
        message = _tool_message(request, outcome)
        if message is None:
            return None
        result = ToolResult(
            call_id=message.tool_call_id,
            tool=message.name or request.tool_call["name"],
            content=counted_content(message.content),
            is_error=message.status == "error",
            offloadable=offloadable,
        )
        key, expected = _step(request)
        return cls(outcome, message, result, {"step": key, "expected": expected})

    def outcome(self, item: Admitted) -> Outcome:
        """The outcome with its message as the gate left it: the very outcome given where
        nothing changed."""
        message = self.message
        content = gated_content(message.content, self.result, item)
        if content is message.content:
            return self.given
        status = "error" if item.is_error else message.status
        gated = message.model_copy(update={"content": content, "status": status})
        if isinstance(self.given, ToolMessage):
            return gated
        update = dict(self.given.update or {})
        update["messages"] = [gated if m is message else m for m in update["messages"]]
        return dataclasses.replace(self.given, update=update)


def _message(request: ToolCallRequest, output: ToolOutput) -> ToolMessage:
    """A spillbox tool's output as the ToolMessage the model gets: its text, then its images
    (a script's charts) as LangChain image blocks."""
    content: str | list[str | dict[str, Any]] = output.text
    if output.images:
        blocks = [
            {"type": "image", "base64": i.base64(), "mime_type": i.mime} for i in output.images
        ]
        content = [{"type": "text", "text": output.text}, *blocks]
    return ToolMessage(
        content=content,
        tool_call_id=request.tool_call["id"],
        name=request.tool_call["name"],
        status="error" if output.is_error else "success",
    )


def _tool_message(request: ToolCallRequest, outcome: Outcome) -> ToolMessage | None:
    """The ToolMessage answering this call: the outcome, or the one a Command's update adds."""
    if isinstance(outcome, ToolMessage):
        return outcome
    update = outcome.update
    messages = update.get("messages") if isinstance(update, Mapping) else None
    return next(
        (
            m
            for m in messages or ()
            if isinstance(m, ToolMessage) and m.tool_call_id == request.tool_call["id"]
        ),
        None,
    )


def _step(request: ToolCallRequest) -> tuple[Hashable, int]:
    """The call's step: the id of the AIMessage that made it (its calls' ids where it has
    none), and how many of its calls are not answered yet. A call no AIMessage of the state
    holds is a step of its own."""
    call_id = request.tool_call["id"]
    messages = _messages(request.state)
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    for message in reversed(messages):
        if isinstance(message, AIMessage) and any(c["id"] == call_id for c in message.tool_calls):
            ids = tuple(c["id"] for c in message.tool_calls)
            pending = len([i for i in ids if i not in answered])
            return message.id or ids, max(pending, 1)
    return call_id, 1


def _messages(state: Any) -> Sequence[Any]:
    """The messages of a ToolNode's state: a dict's or a model's "messages", or the list."""
    if isinstance(state, list):
        return state
    found = state.get("messages") if isinstance(state, Mapping) else getattr(state, "messages", ())
    return found if isinstance(found, list) else ()
