"""The resources of one proxied connection: the task's stored payloads (spillbox.mcp.links),
or the upstream's own where it serves resources; a payload's URI is read page by page."""

from __future__ import annotations

import json
from collections.abc import Callable

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.shared.exceptions import MCPError

from spillbox.mcp.inputs import relay_progress
from spillbox.mcp.links import artifact_uri, parse_uri, resource
from spillbox.mcp.local import LocalTools
from spillbox.mcp.upstream import Ctx, Upstream
from spillbox.protocols import TaskHandle


class Resources:
    """resources/list and resources/read for one connection."""

    def __init__(
        self,
        task: TaskHandle,
        upstream: Upstream | None,
        local: Callable[[], LocalTools],
        redacted: Callable[[types.ReadResourceResult, str], types.ReadResourceResult],
    ) -> None:
        """local: the connection's spillbox tools now (renamed when the upstream's change);
        redacted: what reaches the model around the gate, redacted as the task says."""
        self.task = task
        self.upstream = upstream
        self._local = local
        self._redacted = redacted

    async def list(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        """The upstream's resources where it has any, else the task's stored payloads."""
        if self._upstream_has_resources():
            assert self.upstream is not None
            request = types.ListResourcesRequest(params=params)
            return await self.upstream.request(request, types.ListResourcesResult)
        rows = await anyio.to_thread.run_sync(self.task.artifacts)
        return types.ListResourcesResult(resources=[resource(row) for row in rows])

    async def read(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        """A page of a stored payload; any other URI is the upstream's."""
        try:
            parsed = parse_uri(str(params.uri))
        except ValueError as e:
            raise MCPError(types.INVALID_PARAMS, f"{params.uri}: {e}") from None
        if parsed is None:
            if self.upstream is None:
                raise MCPError(types.INVALID_PARAMS, f"unknown resource {params.uri}")
            request = types.ReadResourceRequest(params=params)
            read = await self.upstream.request(
                request, types.ReadResourceResult, relay_progress(ctx)
            )
            return self._redacted(read, f"resources/read {params.uri}")
        task_id, artifact_id, query = parsed
        if task_id != self.task.id:
            raise MCPError(
                types.INVALID_PARAMS,
                f"{params.uri} is a payload of task {task_id}; this connection serves task "
                f"{self.task.id} (spillbox mcp serve --task {task_id} reads it)",
            )
        output = await anyio.to_thread.run_sync(self._local().read_page, artifact_id, query)
        if output.is_error:
            raise MCPError(types.INVALID_PARAMS, output.text)
        page = json.loads(output.text)
        page["next_uri"] = (
            artifact_uri(task_id, artifact_id, page["next_cursor"]) if page["next_cursor"] else None
        )
        text = json.dumps(page, ensure_ascii=False)
        contents = types.TextResourceContents(
            uri=params.uri, mime_type="application/json", text=text
        )
        return types.ReadResourceResult(contents=[contents])

    def _upstream_has_resources(self) -> bool:
        if self.upstream is None or self.upstream.exited.is_set():
            return False
        capabilities = self.upstream.capabilities
        return capabilities is not None and capabilities.resources is not None
