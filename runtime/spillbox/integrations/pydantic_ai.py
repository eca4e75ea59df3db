"""spillbox for PydanticAI agents: a capability that gates every tool result and offers
spillbox's tools as the agent's own.

    harness = Harness()
    agent = Agent(model, tools=[...], capabilities=[Spillbox(harness)])
    result = await agent.run("Which author merged most?")

What the model sees: each tool result as the tool returned it, or, where it is too large,
a notice naming the stored payload and how to query it with sandbox_exec and read_artifact
(tools the agent now has). Function tools and MCP toolsets' tools pass the same hook
(`wrap_tool_execute` and `after_tool_execute`; output tools are not tool results).

A step is one model response's tool calls that PydanticAI runs together: the calls of a
batch that passed validation (PydanticAI validates a batch before it runs any of it). Their
results pass the gate together (spillbox.steps). A batch holding a `sequential` tool, or a
run under `parallel_execution_mode('sequential')`, runs its calls one at a time: each is
then a step of its own (the aggregate rule cannot apply). A call that raises (ModelRetry, a
deferral) leaves its step, so the others do not wait for it.

A task is a run's conversation (RunContext.conversation_id: a run continuing
`message_history` keeps it, so the same conversation is the same task); give `task_id` (a
string, or a function of the RunContext) to choose it. The task is closed when the run ends,
so its retention applies then (keep_after_close decides whether a later run of the
conversation still finds its artifacts).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

try:
    from pydantic_ai import RunContext
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import BinaryContent, ToolCallPart, ToolReturn, ToolReturnPart
    from pydantic_ai.tools import Tool, ToolDefinition
    from pydantic_ai.toolsets import FunctionToolset
except ImportError as e:
    raise ImportError(
        "spillbox.integrations.pydantic_ai needs pydantic-ai: pip install 'spillbox[pydantic-ai]'"
    ) from e

import anyio
import anyio.to_thread

from spillbox.harness import Harness, Task
from spillbox.mcp.local import gate_view
from spillbox.retention import Retention
from spillbox.steps import Steps
from spillbox.tools import SPECS, ToolOutput, Toolset, canonical, tool_names
from spillbox.types import Admitted, ToolResult

TaskId = str | Callable[[RunContext[Any]], str]


@dataclass
class _Batches:
    """Which step a call belongs to: the calls of one model response that PydanticAI
    validated together, and so runs together."""

    number: int = 0
    calls: list[str] = field(default_factory=list)
    """The ids of the open batch's calls that passed validation."""
    barrier: bool = False
    """The batch holds a sequential tool: PydanticAI runs it alone."""
    validating: bool = False

    def validated(self, call_id: str, sequential: bool) -> None:
        if not self.validating:  # the first validation after a batch ran opens the next
            self.number, self.calls, self.barrier = self.number + 1, [], False
            self.validating = True
        self.calls.append(call_id)
        self.barrier = self.barrier or sequential

    def step_of(self, call_id: str, one_at_a_time: bool) -> tuple[Hashable, int]:
        """The step key of a call about to run, and how many results the step has."""
        self.validating = False
        if call_id not in self.calls or self.barrier or one_at_a_time:
            return ("call", call_id), 1
        return ("batch", self.number), len(self.calls)


@dataclass
class _Run:
    """One run's task, its Steps and its tools."""

    task: Task
    steps: Steps
    toolset: Toolset
    batches: _Batches = field(default_factory=_Batches)
    entered: dict[str, tuple[Hashable, int]] = field(default_factory=dict)
    """The calls running, by id, with their step: the ones that have not submitted yet."""


@dataclass
class Spillbox(AbstractCapability[Any]):
    """Gates a PydanticAI agent's tool results into a per-conversation spillbox task.

    >>> agent = Agent(model, capabilities=[Spillbox(Harness(), task_id="t1")])  # doctest: +SKIP
    """

    harness: Harness
    task_id: TaskId | None = None
    """The task of a run: a string, or a function of its RunContext; None: the run's
    conversation_id."""
    retention: Retention | None = None
    """The retention the task gets (None: a known task keeps its own, a new one the
    harness's default)."""
    taken: Collection[str] = ()
    """Names of the agent's other tools: one of spillbox's with such a name is offered as
    spillbox_<name> (and notices' hints say so)."""
    python_session: bool = False
    """sandbox_exec's python runs in the task's persistent session unless a call says not."""
    _run: _Run | None = field(default=None, init=False, repr=False)

    async def for_run(self, ctx: RunContext[Any]) -> Spillbox:
        return replace(self)  # fresh per-run state; the task opens in wrap_run

    def get_toolset(self) -> FunctionToolset[Any]:
        names = tool_names(self.harness.backend.languages, self.taken)
        return FunctionToolset([self._tool(name) for name in names])

    def _tool(self, name: str) -> Tool[Any]:
        spec = SPECS[canonical(name)]

        async def call(**arguments: Any) -> ToolOutput:
            return await anyio.to_thread.run_sync(self._active().toolset.call, name, arguments)

        return Tool.from_schema(call, name, spec.description, dict(spec.parameters))

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Any) -> Any:
        task = await anyio.to_thread.run_sync(self._open, ctx)
        self._run = _Run(task, Steps(task.admit), Toolset(task, self.taken, self.python_session))
        try:
            return await handler()
        finally:
            self._run = None
            with anyio.CancelScope(shield=True):  # a cancelled run still applies retention
                await anyio.to_thread.run_sync(task.close)

    def _open(self, ctx: RunContext[Any]) -> Task:
        chosen = self.task_id(ctx) if callable(self.task_id) else self.task_id
        return self.harness.task(chosen or ctx.conversation_id or str(ctx.run_id), self.retention)

    async def wrap_tool_validate(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: Any,
    ) -> Any:
        # Counted once validated: a call that fails (or defers in) validation never runs.
        validated = await handler(args)
        self._active().batches.validated(call.tool_call_id, tool_def.sequential)
        return validated

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        handler: Any,
    ) -> Any:
        run = self._active()
        mode = ctx.tool_manager.get_parallel_execution_mode() if ctx.tool_manager else None
        step = run.batches.step_of(call.tool_call_id, mode == "sequential")
        run.entered[call.tool_call_id] = step
        try:
            return await handler(args)
        finally:
            left = run.entered.pop(call.tool_call_id, None)
            if left is not None:  # it raised before its result was gated
                run.steps.withdraw(step=left[0], expected=left[1])

    async def after_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: Any,
        result: Any,
    ) -> Any:
        run = self._active()
        # An answer to a deferred call comes without wrap_tool_execute: a step of its own.
        key, expected = run.entered.pop(call.tool_call_id, (("call", call.tool_call_id), 1))
        if isinstance(result, ToolOutput):  # one of spillbox's own tools
            admitted = await run.steps.submit(
                gate_view(call.tool_call_id, call.tool_name, result), step=key, expected=expected
            )
            return _shown_output(result, admitted)
        value = result.return_value if isinstance(result, ToolReturn) else result
        part = ToolReturnPart(call.tool_name, value, call.tool_call_id)
        text = part.model_response_str()
        gated = ToolResult(call.tool_call_id, call.tool_name, text)
        admitted = await run.steps.submit(gated, step=key, expected=expected)
        shown = _shown(value, text, part.files, admitted)
        if not isinstance(result, ToolReturn):
            return shown
        return replace(result, return_value=shown, content=self._redacted(result, call))

    def _redacted(self, result: ToolReturn[Any], call: ToolCallPart) -> Any:
        """A ToolReturn's content (a user message to the model, around the tool's result)
        with its text redacted under a redacting policy."""
        content = result.content
        task = self._active().task
        if isinstance(content, str):
            return task.redacted(content, call.tool_name)
        if isinstance(content, list):
            return [task.redacted(i, call.tool_name) if isinstance(i, str) else i for i in content]
        return content

    def _active(self) -> _Run:
        if self._run is None:
            raise RuntimeError("Spillbox's hooks run inside an agent run (Agent.run, .iter)")
        return self._run


def _shown(value: Any, text: str, files: list[Any], admitted: Admitted) -> Any:
    """What the model gets for a result whose text the gate admitted: the very value where
    the gate left its text as it was, else the gate's text followed by the result's files
    (images, audio, documents: they pass untouched, as the MCP proxy passes images)."""
    if admitted.text == text and not admitted.offloaded:
        return value
    return [admitted.text, *files] if files else admitted.text


def _shown_output(output: ToolOutput, admitted: Admitted) -> Any:
    """One of spillbox's tools' output as the model gets it: the gate's text, then the
    images a script left."""
    images = [BinaryContent(data=i.data, media_type=i.mime) for i in output.images]
    return [admitted.text, *images] if images else admitted.text
