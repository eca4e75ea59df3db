"""A small MCP server (the official SDK's low-level Server over stdio) for what no real
server does on demand: a structuredContent much larger than its text, a call that never
answers, a result of a given size, a call that takes a given time, a hostile result of any
shape (`result` answers the CallToolResult it is given). The MCP benchmark
(benchmarks/mcp_bench.py) uses it as its upstream too.

    python toy_server.py [--cancelled FILE] [--pinged FILE] [--listed FILE]
                          [--output-schema JSON] [--http PORT]

--cancelled FILE: a call of `never` that is cancelled writes its request id to FILE.
--pinged FILE: each ping the server answers adds a line to FILE.
--listed FILE: each tools/list the server answers adds a line to FILE.
--output-schema JSON: the outputSchema the tool `result` declares.
--http PORT: serve streamable HTTP at http://127.0.0.1:PORT/mcp (the SDK's own stateful
app, served by uvicorn) instead of stdio.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

OBJECT = {"type": "object"}
TOOLS = [
    types.Tool(
        name="wide",
        description="A short text, and `rows` rows as structuredContent.",
        input_schema={"type": "object", "properties": {"rows": {"type": "integer"}}},
    ),
    types.Tool(
        name="echo",
        description="Returns `text`.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
    ),
    types.Tool(name="never", description="Never answers.", input_schema=OBJECT),
    types.Tool(
        name="blob",
        description="A text of `size` bytes.",
        input_schema={"type": "object", "properties": {"size": {"type": "integer"}}},
    ),
    types.Tool(
        name="capabilities",
        description="Answers the capabilities its client declared, as JSON.",
        input_schema={"type": "object"},
    ),
    types.Tool(
        name="exit",
        description="Exits the server at once with `status`.",
        input_schema={"type": "object", "properties": {"status": {"type": "integer"}}},
    ),
    types.Tool(
        name="result",
        description="Answers `result`, a CallToolResult as the wire has it.",
        input_schema={"type": "object", "properties": {"result": {"type": "object"}}},
    ),
    types.Tool(
        name="ask",
        description="Asks its client for a sampling answer to `prompt`, then for its roots, "
        "and answers both and `size` bytes after them: in 2026-07-28 in two input_required "
        "rounds, in 2025-11-25 as requests to the client.",
        input_schema={
            "type": "object",
            "properties": {"prompt": {"type": "string"}, "size": {"type": "integer"}},
        },
    ),
    types.Tool(
        name="region",
        description="Answers `region`, which a 2026-07-28 client also sends as a header.",
        input_schema={
            "type": "object",
            "properties": {"region": {"type": "string", "x-mcp-header": "Region"}},
        },
    ),
    types.Tool(
        name="sleep",
        description="Answers `text` after `seconds`.",
        input_schema={
            "type": "object",
            "properties": {"seconds": {"type": "number"}, "text": {"type": "string"}},
        },
    ),
]


def rows(count: int) -> list[dict[str, Any]]:
    return [{"id": n, "name": f"user {n}", "team": f"t{n % 9}"} for n in range(count)]


def blob(size: int) -> str:
    line = "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz012345678\n"
    whole, rest = divmod(size, len(line))
    return line * whole + line[:rest]


def question(prompt: str) -> types.SamplingMessage:
    return types.SamplingMessage(role="user", content=types.TextContent(text=prompt))


def asked(sampled: types.CreateMessageResult, roots: types.ListRootsResult, size: int) -> str:
    assert isinstance(sampled.content, types.TextContent)
    uris = ", ".join(str(root.uri) for root in roots.roots)
    return f"sampled: {sampled.content.text}; roots: {uris}\n{blob(size)}"


async def ask(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult | types.InputRequiredResult:
    """The tool `ask`, in the era of its client: its state carries the sampled answer from
    the first round to the second."""
    args = params.arguments or {}
    size = int(args.get("size", 0))
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        sampled = await ctx.session.create_message([question(str(args["prompt"]))], max_tokens=10)
        assert isinstance(sampled, types.CreateMessageResult)
        text = asked(sampled, await ctx.session.list_roots(), size)
        return types.CallToolResult(content=[types.TextContent(text=text)])
    answers = params.input_responses or {}
    if params.request_state is None:
        sampling = types.CreateMessageRequestParams(
            messages=[question(str(args["prompt"]))], max_tokens=10
        )
        request = types.CreateMessageRequest(params=sampling)
        return types.InputRequiredResult(input_requests={"sample": request}, request_state="1")
    if params.request_state == "1":
        sampled = types.CreateMessageResult.model_validate(
            answers["sample"].model_dump(by_alias=True)
        )
        request_state = sampled.model_dump_json(by_alias=True, exclude_none=True)
        roots = {"roots": types.ListRootsRequest()}
        return types.InputRequiredResult(input_requests=roots, request_state=request_state)
    sampled = types.CreateMessageResult.model_validate_json(params.request_state)
    roots = types.ListRootsResult.model_validate(answers["roots"].model_dump(by_alias=True))
    return types.CallToolResult(content=[types.TextContent(text=asked(sampled, roots, size))])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cancelled", type=Path)
    parser.add_argument("--pinged", type=Path)
    parser.add_argument("--listed", type=Path)
    parser.add_argument("--output-schema", type=json.loads)
    parser.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument(
        "--resource-text", help="serve one resource (as text and as a blob) and one prompt of it"
    )
    parser.add_argument(
        "--resource-size", type=int, help="the same, of blob(SIZE) (a long text: no argument)"
    )
    options = parser.parse_args()
    tools = [
        tool.model_copy(update={"output_schema": options.output_schema})
        if tool.name == "result"
        else tool
        for tool in TOOLS
    ]

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if options.listed is not None:
            with options.listed.open("a") as listed:
                listed.write("tools/list\n")
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | dict[str, Any]:
        args = params.arguments or {}
        if params.name == "wide":
            table = {"rows": rows(int(args.get("rows", 10)))}
            summary = f"{len(table['rows'])} rows"
            return types.CallToolResult(
                content=[types.TextContent(text=summary)], structured_content=table
            )
        if params.name == "echo":
            return types.CallToolResult(content=[types.TextContent(text=str(args["text"]))])
        if params.name == "never":
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                if options.cancelled is not None:
                    options.cancelled.write_text(str(ctx.request_id))
                raise
        if params.name == "blob":
            text = blob(int(args["size"]))
            return types.CallToolResult(content=[types.TextContent(text=text)])
        if params.name == "capabilities":
            declared = ctx.session.client_capabilities
            assert declared is not None
            text = declared.model_dump_json(by_alias=True, exclude_none=True)
            return types.CallToolResult(content=[types.TextContent(text=text)])
        if params.name == "exit":
            os._exit(int(args.get("status", 0)))
        if params.name == "result":
            # As given (the SDK adds no defaults to a dict), but the resultType that
            # 2026-07-28 requires of every result.
            modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
            return {"resultType": "complete", **args["result"]} if modern else args["result"]
        if params.name == "ask":
            return await ask(ctx, params)
        if params.name == "region":
            return types.CallToolResult(content=[types.TextContent(text=str(args["region"]))])
        if params.name == "sleep":
            await anyio.sleep(float(args.get("seconds", 0)))
            text = str(args.get("text", "done"))
            return types.CallToolResult(content=[types.TextContent(text=text)])
        raise ValueError(f"unknown tool {params.name}")

    async def ping(
        ctx: ServerRequestContext[Any, Any], params: types.RequestParams
    ) -> types.EmptyResult:
        if options.pinged is not None:
            with options.pinged.open("a") as pinged:
                pinged.write("ping\n")
        return types.EmptyResult()

    text = options.resource_text if options.resource_size is None else blob(options.resource_size)

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[types.Resource(uri="toy://config", name="config")]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        blob = base64.b64encode(text.encode()).decode()
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(uri=params.uri, text=text),
                types.BlobResourceContents(uri=params.uri, blob=blob, mime_type="text/plain"),
            ]
        )

    async def list_prompts(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="configure")])

    async def get_prompt(
        ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        message = types.PromptMessage(role="user", content=types.TextContent(text=text))
        return types.GetPromptResult(description=f"about {text}", messages=[message])

    served: dict[str, Any] = {}
    if text is not None:
        served = {
            "on_list_resources": list_resources,
            "on_read_resource": read_resource,
            "on_list_prompts": list_prompts,
            "on_get_prompt": get_prompt,
        }
    server: Server[Any] = Server(
        "toy", on_list_tools=list_tools, on_call_tool=call_tool, on_ping=ping, **served
    )

    if options.http is not None:
        app = server.streamable_http_app()
        uvicorn.run(app, host="127.0.0.1", port=options.http, log_level="warning")
        return

    async def serve() -> None:
        async with stdio_server() as (read, write):
            options_ = server.create_initialization_options(NotificationOptions())
            await server.run(read, write, options_)

    anyio.run(serve)


if __name__ == "__main__":
    sys.exit(main())
