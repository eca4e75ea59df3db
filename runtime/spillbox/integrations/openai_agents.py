"""spillbox inside the OpenAI Agents SDK (openai-agents): a run's tool outputs pass the task's
gate before the model sees them, and spillbox's tools are the agent's own FunctionTools.

    from spillbox.integrations.openai_agents import SpillboxRun

    async with SpillboxRun.open(harness, agent, session=session) as spill:
        result = await Runner.run(spill.agent, prompt, run_config=spill.run_config(),
                                  session=session)

or, the same in one call: `await run(harness, agent, prompt, session=session)`.

The hook is the SDK's `RunConfig(call_model_input_filter=...)`: SpillboxInputFilter sees the
whole input of every model call, so it gates every tool output the model would see (function
tools, MCP servers' tools, shell, local shell, apply_patch, custom tools, hosted MCP calls),
each as the Responses adapter reads and writes that content (spillbox.adapters). A step is
the outputs answering one model turn's calls (the calls that follow one another in the
input): they pass Steps together, as one aggregate. An output gated once is given again as
gated in every later model call of the run (the SDK sends each call's whole history), never
gated twice: the filter keeps what it gave for each call id.

A task per run: the task id given, else the session's id (one task for a conversation that
spans runs), else a new id per run; the task is closed when the run ends, so its retention
applies then.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import AsyncIterator, Collection, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

try:
    from agents import Agent, FunctionTool, RunConfig, RunContextWrapper, Runner
    from agents.run_config import CallModelData, ModelInputData
    from agents.tool_context import ToolContext
except ImportError as e:
    raise ImportError(
        "spillbox.integrations.openai_agents needs openai-agents: "
        "pip install 'spillbox[openai-agents]'"
    ) from e

from spillbox.adapters import DEFAULT_TOOL_NAME, counted_content, gated_content, tool_content
from spillbox.steps import Steps
from spillbox.tools import ToolOutput, Toolset
from spillbox.types import ToolResult

if TYPE_CHECKING:
    from agents import RunResult
    from agents.memory import Session

    from spillbox.harness import Harness, Task
    from spillbox.protocols import TaskHandle
    from spillbox.retention import Retention
    from spillbox.tools import ToolSpec
    from spillbox.types import Admitted

TASK_PREFIX = "openai-agents-"
"""A run's task id, where neither a task id nor a session is given, is this and a uuid."""

_OUTPUTS: dict[str, str | None] = {
    "function_call_output": None,
    "custom_tool_call_output": None,
    "local_shell_call_output": "local_shell",
    "shell_call_output": "shell",
    "apply_patch_call_output": "apply_patch",
    "mcp_call": None,
}
"""The input items that hold a tool's output (in "output"), with the tool's name where the
item type names it; None: the call's own name (a hosted MCP call carries its own)."""

_CALLS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "computer_call",
        "mcp_call",
    }
)
"""The input items that are a model's tool calls: the calls of one turn follow one another."""
_BETWEEN_CALLS = frozenset({"reasoning"})
"""Items that may come between the calls of one turn."""


@dataclass(frozen=True)
class _Slot:
    """One tool output in the model's input."""

    index: int
    item: Mapping[str, Any]
    kind: str
    call_id: str
    tool: str
    turn: int
    """Which run of consecutive calls its call was in; -1 where the call is not in the input."""

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.call_id


@dataclass(frozen=True)
class _Gated:
    """What the model was given for one output: its content as it came, and as gated."""

    original: Any
    shown: Any

    def given(self, item: Any, slot: _Slot) -> Any:
        """The item the model gets in place of item: item itself where the gate left its
        output as it was."""
        return item if self.shown is self.original else {**slot.item, "output": self.shown}


@dataclass
class SpillboxInputFilter:
    """RunConfig.call_model_input_filter: every tool output of a run through a task's gate,
    each model turn's outputs as one step. One per run (it keeps the run's gated outputs).

    >>> config = RunConfig(call_model_input_filter=SpillboxInputFilter(task))  # doctest: +SKIP
    """

    task: TaskHandle
    outputs: dict[str, ToolOutput] = field(default_factory=dict)
    """The outputs of spillbox's own tools by call id (the FunctionTools of spillbox_tools
    fill it): whether each is an error and whether it may be offloaded (a page may not)."""
    _steps: Steps = field(init=False, repr=False)
    _gated: dict[tuple[str, str], _Gated] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._steps = Steps(self.task.admit)

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        model_data = data.model_data
        items: list[Any] = list(model_data.input)
        steps: dict[int, list[_Slot]] = {}
        for slot in _slots(items):
            done = self._gated.get(slot.key)
            if done is not None and _same(done.original, slot.item["output"]):
                items[slot.index] = done.given(items[slot.index], slot)
            else:
                steps.setdefault(slot.turn, []).append(slot)
        for step in steps.values():
            for slot, gated in zip(step, await self._admit(step), strict=True):
                self._gated[slot.key] = gated
                items[slot.index] = gated.given(items[slot.index], slot)
        return ModelInputData(input=items, instructions=model_data.instructions)

    async def _admit(self, step: Sequence[_Slot]) -> list[_Gated]:
        """One step's outputs through the gate together."""
        results = [self._result(slot) for slot in step]
        key: Hashable = tuple(slot.key for slot in step)
        submits = [self._steps.submit(r, step=key, expected=len(results)) for r in results]
        # One output needs no task of its own to wait beside the others (a task costs more
        # than gating a small output).
        admitted = [await submits[0]] if len(submits) == 1 else await asyncio.gather(*submits)
        return [
            _Gated(slot.item["output"], _shown(slot, result, item))
            for slot, result, item in zip(step, results, admitted, strict=True)
        ]

    def _result(self, slot: _Slot) -> ToolResult:
        ours = self.outputs.get(slot.call_id)
        content = counted_content(slot.item["output"])
        if ours is None:
            return ToolResult(slot.call_id, slot.tool, content)
        return ToolResult(slot.call_id, slot.tool, content, ours.is_error, ours.offloadable)


def _shown(slot: _Slot, result: ToolResult, admitted: Admitted) -> Any:
    """The output the model gets: as the Responses adapter writes it; a shell call's output
    stays a list of output chunks (stdout, stderr, outcome), the notice as its stdout."""
    output = slot.item["output"]
    if slot.kind == "shell_call_output" and admitted.reason is not None:
        chunks = [c for c in output if isinstance(c, Mapping)] if isinstance(output, list) else []
        outcome = chunks[-1].get("outcome") if chunks else None
        return [{"stdout": admitted.text, "stderr": "", "outcome": outcome or _EXITED}]
    return gated_content(output, result, admitted)


_EXITED = {"type": "exit", "exit_code": 0}


def _same(before: Any, now: Any) -> bool:
    return before is now or before == now


def _slots(items: Sequence[Any]) -> list[_Slot]:
    """The tool outputs in a model's input, each with its tool's name and its call's turn."""
    turns: dict[str, tuple[int, str]] = {}
    turn, in_calls = -1, False
    slots: list[_Slot] = []
    for index, given in enumerate(items):
        item = _as_item(given)
        kind = item.get("type") if item is not None else None
        if item is None or kind in _BETWEEN_CALLS:
            in_calls = in_calls and item is not None
            continue
        call_id = str(item.get("call_id") or item.get("id") or "")
        if kind in _CALLS:
            turn += 0 if in_calls else 1
            in_calls = True
            turns[call_id] = (turn, str(item.get("name") or _OUTPUTS.get(f"{kind}_output") or ""))
        else:
            in_calls = False
        if kind in _OUTPUTS and item.get("output") is not None:
            at, name = turns.get(call_id, (-1, ""))
            tool = _OUTPUTS[kind] or name or DEFAULT_TOOL_NAME
            slots.append(_Slot(index, item, kind, call_id, tool, at))
    return slots


def _as_item(item: Any) -> Mapping[str, Any] | None:
    """An input item as a mapping: an item given as a model (a caller's own input) dumped."""
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    dumped = dump(exclude_unset=True) if callable(dump) else None
    return dumped if isinstance(dumped, Mapping) else None


def spillbox_tools(toolset: Toolset, gate: SpillboxInputFilter) -> list[FunctionTool]:
    """spillbox's tools (sandbox_exec, read_artifact, list_artifacts, search_artifacts) as
    the SDK's FunctionTools, named as the toolset names them; each call's output is kept in
    gate.outputs, and its images follow its text."""
    return [_function_tool(spec, toolset, gate.outputs) for spec in toolset.specs()]


def _function_tool(
    spec: ToolSpec, toolset: Toolset, outputs: dict[str, ToolOutput]
) -> FunctionTool:
    async def invoke(context: ToolContext[Any], arguments: str) -> Any:
        # In a worker thread: a script in the sandbox blocks until it ends.
        output = await asyncio.to_thread(toolset.call, spec.name, arguments)
        outputs[context.tool_call_id] = output
        return tool_content(output.text, output.images, "responses")

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=dict(spec.parameters),
        on_invoke_tool=invoke,
        strict_json_schema=spec.strict,
    )


class SpillboxRun:
    """One agent run with spillbox: its task, its gate and its tools.

    >>> async with SpillboxRun.open(harness, agent) as spill:  # doctest: +SKIP
    ...     result = await Runner.run(spill.agent, "hi", run_config=spill.run_config())
    """

    def __init__(self, task: Task, agent: Agent[Any], taken: Collection[str] = ()) -> None:
        """taken: the names of the agent's other tools (spillbox's get PREFIX where one
        is taken)."""
        self.task = task
        self.toolset = Toolset(task, taken)
        self.input_filter = SpillboxInputFilter(task)
        self.tools = spillbox_tools(self.toolset, self.input_filter)
        self.agent: Agent[Any] = agent.clone(tools=[*agent.tools, *self.tools])
        """The agent with spillbox's tools added (the given agent is left as it was)."""

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        harness: Harness,
        agent: Agent[Any],
        *,
        session: Session | None = None,
        task_id: str | None = None,
        retention: Retention | None = None,
    ) -> AsyncIterator[SpillboxRun]:
        """The run's task (task_id; else the session's id; else a new one), open for the
        block and closed at its end, when its retention applies."""
        ident = task_id or (session.session_id if session is not None else None)
        # In a worker thread: opening a task may wait for its sandbox's storage and locks.
        task = await asyncio.to_thread(
            harness.task, ident or TASK_PREFIX + uuid.uuid4().hex, retention
        )
        try:
            yield cls(task, agent, await _tool_names(agent))
        finally:
            await asyncio.to_thread(task.close)

    def run_config(self, config: RunConfig | None = None) -> RunConfig:
        """config (or a new RunConfig) with this run's input filter; a filter config already
        has runs first, and spillbox gates what it returns."""
        base = config or RunConfig()
        before = base.call_model_input_filter
        if before is None:
            return replace(base, call_model_input_filter=self.input_filter)

        async def both(data: CallModelData[Any]) -> ModelInputData:
            first = before(data)
            filtered = await first if inspect.isawaitable(first) else first
            if not isinstance(filtered, ModelInputData):
                raise TypeError("call_model_input_filter must return a ModelInputData instance")
            return await self.input_filter(replace(data, model_data=filtered))

        return replace(base, call_model_input_filter=both)


async def _tool_names(agent: Agent[Any]) -> set[str]:
    """The names of an agent's tools, its MCP servers' included (they must be connected,
    as for Runner.run)."""
    tools = [*agent.tools, *(await agent.get_mcp_tools(RunContextWrapper(context=None)))]
    return {name for tool in tools if isinstance(name := getattr(tool, "name", None), str)}


async def run(
    harness: Harness,
    agent: Agent[Any],
    input: str | list[Any],
    *,
    session: Session | None = None,
    task_id: str | None = None,
    retention: Retention | None = None,
    run_config: RunConfig | None = None,
    **kwargs: Any,
) -> RunResult:
    """Runner.run with spillbox: the agent gets spillbox's tools, every tool output passes
    the run's task's gate, and the task is closed when the run ends. kwargs go to
    Runner.run (context, max_turns, hooks...)."""
    async with SpillboxRun.open(
        harness, agent, session=session, task_id=task_id, retention=retention
    ) as spill:
        return await Runner.run(
            spill.agent,
            input,
            run_config=spill.run_config(run_config),
            session=session,
            **kwargs,
        )
