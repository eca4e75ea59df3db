"""spillbox's own tools (sandbox_exec, read_artifact, list_artifacts) as MCP tools.

    local = LocalTools(task, taken={"read_artifact"})   # names another tool already has
    local.names                  # ('sandbox_exec', 'spillbox_read_artifact', 'list_artifacts')
    await local.call(call_id, name, arguments)          # a ToolResult, for the gate

Building a LocalTools registers its names with the task, so notices' hints name the tools
as the client sees them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import anyio.to_thread
import mcp_types as types

from spillbox.protocols import TaskHandle
from spillbox.tools import READ_ARTIFACT, SANDBOX_EXEC, ToolOutput, Toolset, canonical
from spillbox.types import ToolResult

_READ_ONLY = types.ToolAnnotations(read_only_hint=True, open_world_hint=False)


class LocalTools:
    """spillbox's tools for one task, named around the other tools the client sees."""

    def __init__(self, task: TaskHandle, taken: Collection[str] = ()) -> None:
        self.toolset = Toolset(task, taken)
        self.names = self.toolset.names
        task.register_tools(self.names)

    def definitions(self) -> list[types.Tool]:
        return [
            types.Tool(
                name=spec.name,
                description=spec.description,
                input_schema=dict(spec.parameters),
                annotations=_READ_ONLY if canonical(spec.name) != SANDBOX_EXEC else None,
            )
            for spec in self.toolset.specs()
        ]

    async def call(
        self, call_id: str, name: str, arguments: Mapping[str, Any] | None
    ) -> ToolResult:
        """Run one of the tools (in a worker thread: code mode blocks) for the gate."""
        output = await anyio.to_thread.run_sync(self.toolset.call, name, dict(arguments or {}))
        return ToolResult(call_id, name, output.text, output.is_error, output.offloadable)

    def read_page(self, artifact_id: str, cursor: str | None) -> ToolOutput:
        """One page of an artifact, as read_artifact returns it (blocks: run it in a thread)."""
        [name] = [name for name in self.names if canonical(name) == READ_ARTIFACT]
        arguments = {"path": None, "artifact_id": artifact_id, "cursor": cursor, "records": None}
        return self.toolset.call(name, arguments)


def as_call_result(result: ToolResult) -> types.CallToolResult:
    """A local tool's output as the CallToolResult the gate's decision is applied to."""
    text = result.content if isinstance(result.content, str) else result.content.decode()
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=result.is_error)
