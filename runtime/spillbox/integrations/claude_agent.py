"""spillbox inside the Claude Agent SDK (the `claude` CLI's Python SDK).

    with SpillboxSession(harness, ClaudeAgentOptions(mcp_servers={...})) as spill:
        async for message in query(prompt="...", options=spill.options):
            ...

spill.options is a copy of the options given with three things added: spillbox's tools as
an in-process MCP server named "spillbox" (the model sees mcp__spillbox__sandbox_exec,
mcp__spillbox__read_artifact, mcp__spillbox__list_artifacts, allowed without a prompt),
and PreToolUse, PostToolUse, PostToolUseFailure and Stop hooks for every tool. The PostToolUse
hook hands each result to the task's gate and puts what the gate admits in the result's
place (updatedMCPToolOutput for MCP tools, updatedToolOutput in the tool's own shape for
Bash, Read and Grep); a result the gate leaves as it was is not replaced.

A step is the calls the CLI runs at once: it runs a turn's concurrency-safe calls (read-only
MCP tools, read-only Bash commands, Read, ...) together, and their PostToolUse hooks
concurrently, but any other call alone, its hook before the next call starts. So a step is
the calls that have passed PreToolUse and not yet ended when the first of them ends (per
agent: a sub-agent's calls are steps of their own); a call run alone is a step of one, held
to the per-call limit only, as its hook cannot wait for a later call.

The CLI: options.cli_path, else the one `make install` puts in a checkout (CHECKOUT_CLI,
pinned), else the SDK's own. OFFLINE_ENV keeps it off the network but for
ANTHROPIC_BASE_URL (no telemetry, update checks or error reports).

One task per session: the task id is the SDK's session id (the options' session_id, or
resume's, else a new UUID set as the session id), or task_id where given; close() applies
the task's retention.
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import mcp_types as types

try:
    from claude_agent_sdk import (
        ClaudeAgentOptions,
        HookContext,
        HookMatcher,
        SdkMcpTool,
        ToolAnnotations,
        create_sdk_mcp_server,
    )
except ImportError as e:
    raise ImportError(
        "spillbox.integrations.claude_agent needs claude-agent-sdk: "
        "pip install 'spillbox[claude-agent]'"
    ) from e

from spillbox.errors import ConfigError
from spillbox.mcp.local import LocalTools, as_call_result
from spillbox.mcp.results import gated, tool_result
from spillbox.steps import Steps
from spillbox.tools import ToolOutput, optional_nulls
from spillbox.types import Admitted, ToolResult

if TYPE_CHECKING:
    from spillbox.harness import Harness, Task
    from spillbox.retention import Retention

SERVER = "spillbox"
"""The name of spillbox's MCP server in the options; the model sees its tools as
mcp__spillbox__<tool>."""
NAMESPACE = f"mcp__{SERVER}__"
MCP = "mcp__"
"""How the CLI names every MCP server's tools (mcp__<server>__<tool>)."""

CHECKOUT_CLI = Path(__file__).resolve().parents[3] / ".tools/claude-code/node_modules/.bin/claude"
"""Where `make install` puts the pinned CLI in a checkout."""
OFFLINE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
"""The CLI's settings that stop every request but the model's (without them it looks up
outside hosts and sends HEAD /api/hello)."""

Hooked = dict[str, Any]
"""A hook's answer to the CLI."""


class SpillboxSession:
    """One Claude Agent SDK session (one query() or ClaudeSDKClient conversation) through
    one spillbox task.

    >>> spill = SpillboxSession(harness, ClaudeAgentOptions(cwd="/repo"))  # doctest: +SKIP
    >>> spill.options.allowed_tools  # doctest: +SKIP
    ['mcp__spillbox__sandbox_exec', 'mcp__spillbox__read_artifact', ...]
    """

    def __init__(
        self,
        harness: Harness,
        options: ClaudeAgentOptions | None = None,
        *,
        task_id: str | None = None,
        retention: Retention | None = None,
    ) -> None:
        """task_id: the task's id; None for the session's id. retention: the task's (None
        keeps a known task's, or gives a new one the harness's default)."""
        base = options if options is not None else ClaudeAgentOptions()
        servers = base.mcp_servers
        if not isinstance(servers, dict):
            raise ConfigError("give ClaudeAgentOptions.mcp_servers as a dict to add spillbox's")
        if SERVER in servers:
            raise ConfigError(f"an MCP server is already named {SERVER!r}: rename it")
        session_id = base.session_id or base.resume
        if session_id is None and not base.continue_conversation:
            session_id = str(uuid.uuid4())
            base = replace(base, session_id=session_id)
        if task_id is None and session_id is None:
            raise ConfigError("continue_conversation resumes a session unknown here: give task_id")
        self.task: Task = harness.task(task_id or str(session_id), retention)
        self.steps = Steps(self.task.admit)
        self.local = LocalTools(self.task, namespace=NAMESPACE)
        self._agents: dict[str, _Calls] = {}
        self._outputs: dict[str, list[ToolOutput]] = {}
        """spillbox's own tools' outputs, by call (tool and arguments), until their hook."""
        self.options = replace(
            base,
            cli_path=base.cli_path or (CHECKOUT_CLI if CHECKOUT_CLI.exists() else None),
            mcp_servers={**servers, SERVER: self._server()},
            allowed_tools=[*base.allowed_tools, *(NAMESPACE + n for n in self.local.names)],
            hooks=self._hooks(base.hooks or {}),
        )

    def _server(self) -> Any:
        tools = [
            SdkMcpTool(
                name=spec.name,
                description=spec.description,
                input_schema=optional_nulls(spec),
                handler=self._handler(spec.name),
                annotations=ToolAnnotations.model_validate(
                    (tool.annotations or types.ToolAnnotations()).model_dump(by_alias=True)
                ),
            )
            for spec, tool in zip(self.local.toolset.specs(), self.local.definitions(), strict=True)
        ]
        return create_sdk_mcp_server(SERVER, tools=tools)

    def _handler(self, name: str) -> Any:
        async def call(arguments: dict[str, Any]) -> dict[str, Any]:
            output = await self.local.call(name, arguments)
            self._outputs.setdefault(_call_key(NAMESPACE + name, arguments), []).append(output)
            result = as_call_result(output)
            return {
                "content": [_dump(block) for block in result.content],
                "is_error": result.is_error,
            }

        return call

    def _hooks(self, theirs: Mapping[Any, list[HookMatcher]]) -> dict[Any, list[HookMatcher]]:
        ours: dict[str, Any] = {
            "PreToolUse": self._started,
            "PostToolUse": self._ended,
            "PostToolUseFailure": self._failed,
            "Stop": self._stopped,
        }
        hooks: dict[Any, list[HookMatcher]] = {event: list(m) for event, m in theirs.items()}
        for event, callback in ours.items():
            hooks.setdefault(event, []).append(HookMatcher(matcher=None, hooks=[callback]))
        return hooks

    def _calls(self, data: Mapping[str, Any]) -> _Calls:
        agent = str(data.get("agent_id", ""))
        return self._agents.setdefault(agent, _Calls(agent))

    async def _started(self, data: Any, tool_use_id: str | None, context: HookContext) -> Hooked:
        self._calls(data).started(str(tool_use_id))
        return {}

    async def _stopped(self, data: Any, tool_use_id: str | None, context: HookContext) -> Hooked:
        self._calls(data).stopped()
        return {}

    async def _failed(self, data: Any, tool_use_id: str | None, context: HookContext) -> Hooked:
        """A failed call leaves its step (its error is the CLI's; no hook can replace it)."""
        result = ToolResult(str(tool_use_id), data["tool_name"], "", offloadable=False)
        await self._admitted(data, result)
        return {}

    async def _ended(self, data: Any, tool_use_id: str | None, context: HookContext) -> Hooked:
        call_id, tool, response = str(tool_use_id), data["tool_name"], data["tool_response"]
        shape = _shape(tool, response)
        if shape is None:  # a shape spillbox does not gate: it counts nothing in its step
            await self._admitted(data, ToolResult(call_id, tool, "", offloadable=False))
            return {}
        result = shape.result(call_id, tool)
        if tool.startswith(NAMESPACE):  # a read_artifact page is not offloaded again
            key = _call_key(tool, data["tool_input"])
            outputs = self._outputs.get(key)
            if outputs:
                result = replace(result, offloadable=outputs.pop(0).offloadable)
                if not outputs:
                    del self._outputs[key]
        admitted = await self._admitted(data, result)
        updated = shape.updated(admitted)
        if updated is None:
            return {}
        slot = "updatedMCPToolOutput" if tool.startswith(MCP) else "updatedToolOutput"
        return {"hookSpecificOutput": {"hookEventName": "PostToolUse", slot: updated}}

    async def _admitted(self, data: Mapping[str, Any], result: ToolResult) -> Admitted:
        step, expected = self._calls(data).step_of(result.call_id)
        return await self.steps.submit(result, step=step, expected=expected)

    def close(self) -> None:
        """End the session's task: its retention applies (Task.close)."""
        self.task.close()

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> SpillboxSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> SpillboxSession:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@dataclass
class _Calls:
    """One agent's calls under way (PreToolUse seen, not yet ended), and the step the
    first of them to end opened: the calls under way then, which the CLI runs at once."""

    agent: str
    """The sub-agent's id; "" for the main thread."""
    running: set[str] = field(default_factory=set)
    members: frozenset[str] = frozenset()
    step: int = 0
    _steps: itertools.count[int] = field(default_factory=itertools.count)

    def started(self, call_id: str) -> None:
        self.running.add(call_id)

    def step_of(self, call_id: str) -> tuple[Hashable, int]:
        """The key of call_id's step and how many results the step has."""
        if call_id not in self.members:
            # A call the CLI's permissions refuse after PreToolUse is heard of by no hook:
            # taken out of running here, it holds up one step (for STEP_BOUND_SECONDS) at most.
            self.members = frozenset(self.running | {call_id})
            self.running.clear()
            self.step = next(self._steps)
        return (self.agent, self.step), len(self.members)

    def stopped(self) -> None:
        """The turn ended (Stop): no call is under way."""
        self.running.clear()


@dataclass(frozen=True)
class _Shape:
    """A tool's output as the hook gets it: the text the gate counts, and how the output
    with the admitted text in its place is written back."""

    text: str
    write: Any
    """text -> the tool's output with text in place of what was counted."""
    is_error: bool = False
    mcp: types.CallToolResult | None = None

    def result(self, call_id: str, tool: str) -> ToolResult:
        if self.mcp is not None:
            return tool_result(call_id, tool, self.mcp)
        return ToolResult(call_id, tool, self.text, self.is_error)

    def updated(self, admitted: Admitted) -> Any:
        """The output to put in the result's place; None to leave the tool's own."""
        if self.mcp is not None:
            shown = gated(self.mcp, admitted, None)
            return None if shown is self.mcp else self.write(shown)
        return None if admitted.text == self.text else self.write(admitted.text)


TEXT_FIELDS: dict[str, tuple[str, ...]] = {"Read": ("file", "content"), "Grep": ("content",)}
"""Built-in tools whose output is one text, by where it lies in the tool's output (Read's
text file, Grep's matching lines in content mode); Bash's is its stdout and stderr."""


def _shape(tool: str, response: Any) -> _Shape | None:
    """The gate's view of a tool's output (MCP content, Bash's output, the text of
    TEXT_FIELDS), or None for a shape spillbox leaves alone (an image, another tool's)."""
    if tool.startswith(MCP):
        return _mcp_shape(response)
    if not isinstance(response, dict):
        return None
    if tool == "Bash" and not response.get("isImage"):
        out, err = str(response.get("stdout", "")), str(response.get("stderr", ""))
        text = f"{out}\n{err}" if out and err else out or err
        return _Shape(text, lambda t: {**response, "stdout": t, "stderr": ""})
    if tool in TEXT_FIELDS and (tool != "Read" or response.get("type") == "text"):
        *outer, last = TEXT_FIELDS[tool]
        holder: Any = response
        for key in outer:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and isinstance(holder.get(last), str):
            return _Shape(holder[last], lambda t: _with(response, TEXT_FIELDS[tool], t))
    return None


def _with(value: dict[str, Any], path: tuple[str, ...], text: str) -> dict[str, Any]:
    """value with text at path (a copy: the tool's own output stays as it was)."""
    head, *rest = path
    return {**value, head: _with(value[head], tuple(rest), text) if rest else text}


def _mcp_shape(response: Any) -> _Shape | None:
    """An MCP tool's output: its content blocks (as the CLI hands them to the hook), or a
    whole CallToolResult."""
    if isinstance(response, str):
        response = [{"type": "text", "text": response}]
    try:
        if isinstance(response, list):
            result = types.CallToolResult.model_validate({"content": response})
            return _Shape("", lambda r: [_dump(b) for b in r.content], mcp=result)
        if isinstance(response, dict) and "content" in response:
            result = types.CallToolResult.model_validate(response)
            return _Shape("", lambda r: _dump(r), mcp=result)
    except ValueError:
        return None
    return None


def _dump(block: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = block.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def _call_key(tool: str, arguments: Any) -> str:
    return json.dumps([tool, arguments], sort_keys=True, default=str)
