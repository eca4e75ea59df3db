"""spillbox inside Google ADK: every tool result passes the task's gate before the model
sees it, and spillbox's tools are the agent's own.

    spillbox = SpillboxPlugin(harness, retention=Retention(redact=True))
    agent = LlmAgent(name="a", model=model, tools=[list_orders, spillbox.toolset()])
    runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=[spillbox]))
    ...                                  # runner.run_async(...) as usual
    await runner.close()                 # closes every session's task (its retention applies)

A task per ADK session (app name, user id and session id; `task_id` chooses another), opened
when the session's first run starts and closed by `end_session` or when the runner closes.

A step is one model turn: after_model_callback counts the function calls of the model's
response (per invocation, branch and agent: an agent's model turns in one branch follow one
another), and after_tool_callback, which ADK runs for each call of the turn concurrently,
submits each result under that turn with that count (spillbox.steps). A call answered
outside a model turn (a confirmation's resumed call) is a step of its own.

What the model sees: a result that passes the gate untouched is left as the tool gave it
(the callback returns None). Otherwise the callback returns a dict in ADK's own shape for a
result that is not a dict, {"result": text}, or {"error": text} for an error: the notice, or
the result redacted; a dict redacted stays that dict. An MCP tool's result (McpToolset: a
CallToolResult as a dict) is gated as spillbox's MCP proxy gates it (spillbox.mcp.results),
its images untouched; images and other media parts of any tool's result stay beside the
notice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import quote

import anyio.to_thread

try:
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.agents.invocation_context import InvocationContext
    from google.adk.agents.readonly_context import ReadonlyContext
    from google.adk.models.llm_response import LlmResponse
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.sessions.session import Session
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.base_toolset import BaseToolset
    from google.adk.tools.mcp_tool.mcp_tool import McpTool
    from google.adk.tools.tool_context import ToolContext
    from google.genai import types as genai
except ImportError as e:
    raise ImportError(
        "spillbox.integrations.google_adk needs google-adk: pip install 'spillbox[google-adk]'"
    ) from e

import mcp_types as types
from pydantic import ValidationError

from spillbox.harness import Harness, Task
from spillbox.mcp.local import gate_view
from spillbox.mcp.results import gated, tool_result
from spillbox.retention import Retention
from spillbox.steps import Steps
from spillbox.tools import ToolOutput, Toolset, ToolSpec
from spillbox.types import Admitted, ToolResult

TaskId = Callable[[Session], str]
"""Chooses the task of an ADK session (given the Session: app_name, user_id, id, state)."""

_SessionKey = tuple[str, str, str]
_TurnKey = tuple[str, str | None, str]
"""A model turn's place: invocation id, branch and agent."""


def session_task_id(session: Session) -> str:
    """The default task of a session: its app name, user id and id (ADK scopes a session id
    to its app and user), each quoted so that no two sessions share a task."""
    return "adk/" + "/".join(quote(part, safe="") for part in _key(session))


@dataclass
class _Run:
    """One invocation's steps: its model turns and the outputs of spillbox's own tools."""

    steps: Steps
    turns: dict[_TurnKey, tuple[int, int]] = field(default_factory=dict)
    """The latest model turn of each agent: its number and how many calls it made."""
    outputs: dict[str, ToolOutput] = field(default_factory=dict)
    """spillbox tools' outputs by function call id, until their result is gated."""


@dataclass
class _Session:
    """One ADK session's task, spillbox's tools for it, and its runs under way."""

    task: Task
    toolset: Toolset
    tools: list[BaseTool] = field(default_factory=list)
    """spillbox's tools as ADK tools, once get_tools made them."""
    runs: dict[str, _Run] = field(default_factory=dict)

    def run(self, invocation_id: str) -> _Run:
        run = self.runs.get(invocation_id)
        if run is None:
            run = self.runs[invocation_id] = _Run(Steps(self.task.admit))
        return run


class SpillboxPlugin(BasePlugin):
    """Gates every tool result of a Runner's agents through the session's spillbox task.

    >>> spillbox = SpillboxPlugin(harness)  # doctest: +SKIP
    >>> app = App(name="shop", root_agent=agent, plugins=[spillbox])  # doctest: +SKIP

    Put it first in `plugins`: ADK stops at the first plugin whose after_tool_callback
    returns a value, so a result another callback replaces before spillbox sees it, or
    after spillbox passed it, is not gated.
    """

    def __init__(
        self,
        harness: Harness,
        *,
        retention: Retention | None = None,
        task_id: TaskId = session_task_id,
        taken: Collection[str] = (),
        name: str = "spillbox",
    ) -> None:
        """retention: for each session's task (None: the harness's default).
        taken: names of the agent's other tools; a spillbox tool with such a name is
        offered as spillbox_<name>, and notices' hints say so."""
        super().__init__(name=name)
        self.harness = harness
        self.retention = retention
        self.task_id = task_id
        self.taken = frozenset(taken)
        self._sessions: dict[_SessionKey, _Session] = {}

    def toolset(self) -> SpillboxToolset:
        """spillbox's tools (sandbox_exec, read_artifact, ...) for an agent's `tools`."""
        return SpillboxToolset(self)

    def task(self, session: Session) -> Task:
        """The task of an ADK session whose run has started."""
        return self._sessions[_key(session)].task

    async def end_session(self, session: Session) -> None:
        """Close the session's task now: its retention applies (keep_after_close)."""
        state = self._sessions.pop(_key(session), None)
        if state is not None:
            await _close(state.task)

    async def close(self) -> None:
        """Runner.close(): every session's task closes, all at once (ADK bounds a plugin's
        close, 5 s by default, and stopping a sandbox takes a while)."""
        sessions, self._sessions = self._sessions, {}
        async with anyio.create_task_group() as group:
            for state in sessions.values():
                group.start_soon(_close, state.task)

    async def before_run_callback(
        self, *, invocation_context: InvocationContext
    ) -> genai.Content | None:
        session = invocation_context.session
        if _key(session) not in self._sessions:
            state = await anyio.to_thread.run_sync(self._open, session)
            self._sessions.setdefault(_key(session), state)
        self._session(session).run(invocation_context.invocation_id)
        return None

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        self._end_run(invocation_context)

    async def on_run_error_callback(
        self, *, invocation_context: InvocationContext, error: Exception
    ) -> None:
        self._end_run(invocation_context)

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        if llm_response.partial:
            return None  # a streamed chunk: its calls come again in the whole response
        run = self._run(callback_context)
        turn = _turn(callback_context)
        calls = len(llm_response.get_function_calls())
        number = run.turns.get(turn, (0, 0))[0] + 1
        run.turns[turn] = (number, calls)
        return None

    async def after_tool_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        result: dict[str, Any],
    ) -> dict[str, Any] | None:
        run = self._run(tool_context)
        call_id = tool_context.function_call_id or ""
        own = run.outputs.pop(call_id, None)
        shown: Callable[[Admitted], Any]
        if own is not None:
            view, shown = gate_view(call_id, tool.name, own), partial(_own_body, own)
        elif isinstance(tool, McpTool) and (mcp := _call_result(result)) is not None:
            view, shown = tool_result(call_id, tool.name, mcp), _mcp_shown(tool, mcp)
        else:
            view, shown = _plain_view(call_id, tool.name, result), _plain_shown(result)
        turn = _turn(tool_context)
        number, calls = run.turns.get(turn, (0, 0))
        step = (turn, number) if calls else (turn, "alone", call_id)
        admitted = await run.steps.submit(view, step=step, expected=max(calls, 1))
        if not admitted.offloaded and admitted.text == view.content:
            return None  # passed untouched: the very result the tool gave
        return shown(admitted)

    def _open(self, session: Session) -> _Session:
        task = self.harness.task(self.task_id(session), self.retention)
        return _Session(task, Toolset(task, self.taken))

    def _session(self, session: Session) -> _Session:
        state = self._sessions.get(_key(session))
        if state is None:
            raise RuntimeError(
                "spillbox's ADK tools and callbacks need SpillboxPlugin in the Runner's "
                "plugins: App(..., plugins=[spillbox])"
            )
        return state

    def _run(self, context: ReadonlyContext) -> _Run:
        return self._session(context.session).run(context.invocation_id)

    def _end_run(self, invocation_context: InvocationContext) -> None:
        state = self._sessions.get(_key(invocation_context.session))
        if state is not None:
            state.runs.pop(invocation_context.invocation_id, None)


class SpillboxToolset(BaseToolset):
    """spillbox's tools as ADK tools, named as the session's Toolset names them."""

    def __init__(self, plugin: SpillboxPlugin) -> None:
        super().__init__()
        self.plugin = plugin

    async def get_tools(self, readonly_context: ReadonlyContext | None = None) -> list[BaseTool]:
        if readonly_context is None:
            return []  # outside a run no session says which task the tools would serve
        state = self.plugin._session(readonly_context.session)
        if not state.tools:  # made once a session: ADK asks for them at every model call
            state.tools = [SpillboxTool(spec, self.plugin) for spec in state.toolset.specs()]
        return list(state.tools)


class SpillboxTool(BaseTool):
    """One of spillbox's tools: its declaration is the Toolset's JSON Schema."""

    def __init__(self, spec: ToolSpec, plugin: SpillboxPlugin) -> None:
        super().__init__(name=spec.name, description=spec.description)
        self.plugin = plugin
        self._declaration = genai.FunctionDeclaration(
            name=spec.name,
            description=spec.description,
            parameters_json_schema=dict(spec.parameters),
        )

    def _get_declaration(self) -> genai.FunctionDeclaration:
        return self._declaration

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        state = self.plugin._session(tool_context.session)
        # In a worker thread: code mode blocks.
        output = await anyio.to_thread.run_sync(state.toolset.call, self.name, dict(args))
        if tool_context.function_call_id is not None:
            state.run(tool_context.invocation_id).outputs[tool_context.function_call_id] = output
        return _own_body(output)


async def _close(task: Task) -> None:
    await anyio.to_thread.run_sync(task.close)  # stopping a sandbox blocks


def _key(session: Session) -> _SessionKey:
    return (session.app_name, session.user_id, session.id)


def _turn(context: ToolContext) -> _TurnKey:
    return (context.invocation_id, context.branch, context.agent_name)


def _own_body(output: ToolOutput, admitted: Admitted | None = None) -> dict[str, Any]:
    """A spillbox tool's output as the model sees it: its text (or the gate's), then its
    images (a script's charts) as media parts, which ADK shows the model as such."""
    text = output.text if admitted is None else admitted.text
    body: dict[str, Any] = {"error" if output.is_error else "result": text}
    if images := output.images:
        body["images"] = [genai.Part.from_bytes(data=i.data, mime_type=i.mime) for i in images]
    return body


def _call_result(result: Any) -> types.CallToolResult | None:
    """An MCP tool's result as the CallToolResult it was (None: an error ADK made)."""
    try:
        return types.CallToolResult.model_validate(result)
    except ValidationError:
        return None


def _mcp_shown(tool: McpTool, result: types.CallToolResult) -> Callable[[Admitted], Any]:
    schema = tool.raw_mcp_tool.output_schema

    def shown(admitted: Admitted) -> Any:
        body = gated(result, admitted, schema).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        body.pop("resultType", None)  # as McpTool leaves a result: without it
        return body

    return shown


def _media(result: Any) -> list[genai.Part]:
    """The media parts of a tool's result, where ADK looks for them (the result, its
    entries, and theirs): they pass beside the gate as images do."""
    found: list[genai.Part] = []

    def walk(value: Any, depth: int) -> None:
        if isinstance(value, genai.Part):
            found.append(value)
        elif depth < 2 and isinstance(value, dict | list | tuple):
            for item in value.values() if isinstance(value, dict) else value:
                walk(item, depth + 1)

    walk(result, 0)
    return found


def _not_json(value: Any) -> Any:
    if isinstance(value, genai.Part):
        return None  # media: shown beside the notice, not counted
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    return str(value)


def _plain_view(call_id: str, tool: str, result: Any) -> ToolResult:
    """What the gate counts of a tool's result: a string as it is, anything else as JSON;
    {"error": ...} is ADK's shape for a tool that failed."""
    if isinstance(result, str):
        content = result
    else:
        content = json.dumps(result, ensure_ascii=False, default=_not_json)
    is_error = isinstance(result, dict) and "error" in result
    return ToolResult(call_id, tool, content, is_error=is_error)


def _plain_shown(result: Any) -> Callable[[Admitted], dict[str, Any]]:
    media = _media(result)

    def shown(admitted: Admitted) -> dict[str, Any]:
        if not admitted.offloaded and isinstance(result, dict) and not media:
            try:  # redacted: the same dict, its secrets replaced
                redacted = json.loads(admitted.text)
            except ValueError:
                redacted = None
            if isinstance(redacted, dict):
                return redacted
        body = {"error" if admitted.is_error else "result": admitted.text}
        return {**body, "media": media} if media else body

    return shown
