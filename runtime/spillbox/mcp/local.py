"""spillbox's own tools (sandbox_exec, read_artifact, list_artifacts) as MCP tools.

    local = LocalTools(task, taken={"read_artifact"})   # names another tool already has
    local.names                  # ('sandbox_exec', 'spillbox_read_artifact', 'list_artifacts')
    output = await local.call(name, arguments)          # a ToolOutput
    gate_view(call_id, name, output)                    # a ToolResult, for the gate
    as_call_result(output)                              # what the client gets: text, images

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

    def __init__(self, task: TaskHandle, taken: Collection[str] = (), namespace: str = "") -> None:
        """namespace: what the client shows before each tool's name (Toolset's namespace)."""
        self.toolset = Toolset(task, taken, namespace=namespace)
        self.names = self.toolset.names

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

    async def call(self, name: str, arguments: Mapping[str, Any] | None) -> ToolOutput:
        """Run one of the tools (in a worker thread: code mode blocks)."""
        return await anyio.to_thread.run_sync(self.toolset.call, name, dict(arguments or {}))

    def read_page(self, artifact_id: str, query: Mapping[str, Any]) -> ToolOutput:
        """One page of an artifact, as read_artifact returns it for these arguments (a
        resource URI's query: cursor, start, limit, records, fields); blocks: run it in a
        thread."""
        [name] = [name for name in self.names if canonical(name) == READ_ARTIFACT]
        return self.toolset.call(name, {**query, "path": None, "artifact_id": artifact_id})


def gate_view(call_id: str, name: str, output: ToolOutput) -> ToolResult:
    """What the gate counts of a local tool's output: its text (images pass untouched, as
    an upstream's do)."""
    return ToolResult(call_id, name, output.text, output.is_error, output.offloadable)


def as_call_result(output: ToolOutput) -> types.CallToolResult:
    """A local tool's output as the CallToolResult the gate's decision is applied to: its
    text, then its images (a script's charts) as image content."""
    images = [types.ImageContent(data=i.base64(), mime_type=i.mime) for i in output.images]
    content: list[types.ContentBlock] = [types.TextContent(text=output.text), *images]
    return types.CallToolResult(content=content, is_error=output.is_error)
