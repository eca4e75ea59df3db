"""Attacks on `spillbox mcp proxy` through the parts of a result (issue 21, items 1 and 2).

Under --redact every part of a tools/call result that a client may show the model (text,
structuredContent, embedded resources, resource links, _meta) reaches the client redacted,
however small, and the access log counts exactly what was replaced in what the client got.
Every such part is held to the gate: a short text with a large embedded resource is
offloaded, byte for byte. The upstreams are tests/mcp/toy_server.py (answering any result
it is given) and mcp-server-git; the client is the official SDK's.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp_client import connect, git_server, proxy_params, text_of, toy_server

from redaction_corpus import aws_id, github_pat, slack_bot
from spillbox import Harness, parse_notice

pytestmark = pytest.mark.anyio
pytest_plugins = ["mcp_fixtures"]

SECRETS = (github_pat, aws_id, slack_bot, "hunter2!")
MARK = "[REDACTED:"
TASK = "attacked"
BIG = 1_800_000
"""An embedded resource's size (bytes): what reached the client whole before."""


def wire(result: types.CallToolResult) -> str:
    """The result as the client got it, as JSON."""
    return result.model_dump_json(by_alias=True, exclude_none=True)


def leaked(result: types.CallToolResult) -> list[str]:
    dumped = wire(result)
    found = [secret for secret in SECRETS if secret in dumped]
    blobs = [
        base64.b64decode(b.resource.blob)
        for b in result.content
        if isinstance(b, types.EmbeddedResource)
        and isinstance(b.resource, types.BlobResourceContents)
    ]
    return found + [secret for secret in SECRETS for blob in blobs if secret.encode() in blob]


def marks(result: types.CallToolResult) -> int:
    """The redaction marks in what the client got (a blob's decoded too)."""
    blobs = [
        base64.b64decode(b.resource.blob).decode("utf-8", "replace")
        for b in result.content
        if isinstance(b, types.EmbeddedResource)
        and isinstance(b.resource, types.BlobResourceContents)
    ]
    return wire(result).count(MARK) + sum(blob.count(MARK) for blob in blobs)


def redact_log(home: Path) -> dict[str, int]:
    """The access log's `redact` entries of the task: replacements by call id."""
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        entries = [e for e in harness.catalog.audit(TASK) if e.action == "redact"]
    return {
        json.loads(e.detail).get("call_id") or str(e.artifact_id): json.loads(e.detail)["replaced"]
        for e in entries
    }


async def call(home: Path, result: dict[str, Any], *flags: str, schema: Any = None) -> Any:
    """result, as the toy server answers it through the proxy (--redact unless flags say
    otherwise), and the tool's outputSchema (if schema is given)."""
    server = toy_server(*(["--output-schema", json.dumps(schema)] if schema else []))
    params = proxy_params(home, server, "--task", TASK, *(flags or ("--redact",)))
    async with connect(params) as session:
        return await session.call_tool("result", {"result": result})


def every_part() -> dict[str, Any]:
    """A small result with a secret in each part a client may show."""
    blob = base64.b64encode(f"AWS_ACCESS_KEY_ID={aws_id}\n".encode()).decode()
    return {
        "content": [
            {"type": "text", "text": f"deploy key {github_pat}"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
            {
                "type": "resource",
                "resource": {"uri": "file:///etc/app.env", "text": f"SLACK_TOKEN={slack_bot}\n"},
            },
            {
                "type": "resource",
                "resource": {"uri": "file:///keys", "mimeType": "text/plain", "blob": blob},
            },
            {
                "type": "resource_link",
                "uri": "https://example.com/doc",
                "name": "doc",
                "description": f"fetch it with {github_pat}",
            },
        ],
        "structuredContent": {"owner": "ann", "db": {"password": "hunter2!"}},
        "_meta": {"trace": f"auth with {slack_bot}"},
    }


async def test_every_part_of_a_small_result_reaches_the_client_redacted(home: Path) -> None:
    result = await call(home, every_part())
    assert not result.is_error
    assert leaked(result) == [], wire(result)
    text, image, env, keys, link = result.content
    assert isinstance(text, types.TextContent) and text.text == "deploy key [REDACTED:github_pat]"
    assert image == types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png")  # untouched
    assert isinstance(env, types.EmbeddedResource)
    assert isinstance(env.resource, types.TextResourceContents)
    assert env.resource.text.startswith("SLACK_TOKEN=[REDACTED:")
    assert isinstance(keys, types.EmbeddedResource)
    assert isinstance(keys.resource, types.BlobResourceContents)
    assert b"[REDACTED:" in base64.b64decode(keys.resource.blob)
    assert isinstance(link, types.ResourceLink) and str(link.uri) == "https://example.com/doc"
    assert result.structured_content == {"owner": "ann", "db": {"password": "[REDACTED:password]"}}
    assert result.meta is not None and MARK in result.meta["trace"]
    # The log counts what was replaced, and exactly what the client got.
    assert redact_log(home) == {"result_1": marks(result)}
    assert marks(result) == 6


async def test_without_redaction_the_same_result_passes_as_it_came(home: Path) -> None:
    result = await call(home, every_part(), "--ttl", "1h")
    assert result == types.CallToolResult.model_validate(every_part())
    assert redact_log(home) == {}


async def test_a_secret_in_the_envelope_of_a_repeated_structured_content_is_redacted(
    home: Path,
) -> None:
    """A structuredContent that holds the text and little besides is not counted again: what
    it holds besides must still be redacted."""
    text = "line one\nline two\n"
    structured = {"content": text, "auth": github_pat}
    result = await call(
        home, {"content": [{"type": "text", "text": text}], "structuredContent": structured}
    )
    assert leaked(result) == [], wire(result)
    assert text_of(result) == text
    assert result.structured_content == {"content": text, "auth": "[REDACTED:github_pat]"}
    assert redact_log(home) == {"result_1": marks(result)} == {"result_1": 1}


async def test_a_repeated_structured_content_is_redacted_with_its_text(home: Path) -> None:
    text = f"token: {github_pat}\n"
    result = await call(
        home,
        {"content": [{"type": "text", "text": text}], "structuredContent": {"content": text}},
    )
    assert leaked(result) == []
    redacted = "token: [REDACTED:github_pat]\n"
    assert text_of(result) == redacted
    assert result.structured_content == {"content": redacted}
    assert redact_log(home) == {"result_1": 1}


async def test_a_redacted_value_the_output_schema_rejects_still_gives_a_valid_result(
    home: Path,
) -> None:
    """A secret-named number becomes a string: the tool's outputSchema (held to by the SDK
    client) no longer accepts it, so the redacted text comes in a conforming value."""
    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string"}, "pin_code": {"type": "integer"}},
        "required": ["summary", "pin_code"],
    }
    structured = {"summary": "ok", "pin_code": 4321}
    sent = {"content": [{"type": "text", "text": "done"}], "structuredContent": structured}
    # "pin_code" is no secret name: the same result passes whole.
    assert (await call(home, sent, schema=schema)).structured_content == structured
    structured = {"summary": "ok", "password": 4321}
    schema["properties"]["password"] = schema["properties"].pop("pin_code")
    schema["required"] = ["summary", "password"]
    sent = {"content": [{"type": "text", "text": "done"}], "structuredContent": structured}
    result = await call(home, sent, schema=schema)  # the SDK client validated it
    assert "4321" not in wire(result)
    assert result.structured_content is not None
    assert json.loads(result.structured_content["summary"]) == {
        "text": "done",
        "structuredContent": {"summary": "ok", "password": "[REDACTED:password]"},
    }


async def test_a_commit_message_with_a_token_reaches_the_client_redacted(
    home: Path, tmp_path: Path
) -> None:
    """mcp-server-git's git_log, small enough to stay inline."""
    repo = tmp_path / "repo"
    await anyio.run_process(["git", "init", "-q", "-b", "main", str(repo)])
    message = f"Rotate the deploy key\n\nold one was {github_pat}"
    env = ["-c", "user.name=Dev", "-c", "user.email=dev@example.com"]
    await anyio.run_process(
        ["git", "-C", str(repo), *env, "commit", "-q", "--allow-empty", "-m", message]
    )
    params = proxy_params(home, git_server(repo), "--task", TASK, "--redact")
    async with connect(params) as session:
        result = await session.call_tool("git_log", {"repo_path": str(repo), "max_count": 5})
    assert parse_notice(text_of(result)) is None  # inline
    assert "Rotate the deploy key" in text_of(result)
    assert leaked(result) == [] and "[REDACTED:github_pat]" in text_of(result)
    assert redact_log(home) == {"git_log_1": 1}


async def test_a_large_embedded_resource_behind_a_short_text_is_offloaded(home: Path) -> None:
    body = "0123456789abcdef" * (BIG // 16)
    sent = {
        "content": [
            {"type": "text", "text": "see the attached report"},
            {"type": "resource", "resource": {"uri": "file:///report.txt", "text": body}},
        ]
    }
    result = await call(home, sent, "--ttl", "1h")
    assert len(wire(result)) < 10_000  # the resource did not reach the client
    notice = parse_notice(text_of(result))
    assert notice is not None and notice["reason"].startswith("per_call"), text_of(result)
    assert not any(isinstance(b, types.EmbeddedResource) for b in result.content)
    [link] = [b for b in result.content if isinstance(b, types.ResourceLink)]
    assert str(link.uri).startswith("spillbox://")
    stored = json.loads(await anyio.Path(notice["path"]).read_text())
    assert stored["text"] == "see the attached report"
    assert stored["resources"][0]["resource"] == {"uri": "file:///report.txt", "text": body}


async def test_a_large_binary_blob_and_a_large_meta_are_held_to_the_gate(home: Path) -> None:
    blob = base64.b64encode(bytes(range(256)) * (BIG // 256)).decode()
    sent = {
        "content": [
            {"type": "text", "text": "short"},
            {"type": "resource", "resource": {"uri": "file:///x.bin", "blob": blob}},
        ]
    }
    result = await call(home, sent, "--ttl", "1h")
    assert len(wire(result)) < 10_000
    notice = parse_notice(text_of(result))
    assert notice is not None, text_of(result)
    stored = json.loads(await anyio.Path(notice["path"]).read_text())
    assert stored["resources"][0]["resource"]["blob"] == blob  # binary: kept as base64
    meta = {"content": [{"type": "text", "text": "short"}], "_meta": {"log": "x" * BIG}}
    result = await call(home, meta, "--ttl", "1h")
    assert len(wire(result)) < 10_000 and parse_notice(text_of(result)) is not None


async def test_a_large_image_still_passes_untouched(home: Path) -> None:
    data = base64.b64encode(bytes(BIG)).decode()
    sent = {
        "content": [
            {"type": "text", "text": "a screenshot"},
            {"type": "image", "data": data, "mimeType": "image/png"},
        ]
    }
    result = await call(home, sent)
    assert result == types.CallToolResult.model_validate(sent)


async def read_and_prompt(home: Path, *flags: str) -> tuple[Any, Any]:
    """The toy server's resource and prompt through the proxy, each holding two secrets."""
    secret_text = f"deploy with {github_pat}, AWS_ACCESS_KEY_ID={aws_id}"
    server = toy_server("--resource-text", secret_text)
    params = proxy_params(home, server, "--task", TASK, *flags)
    async with connect(params) as session:
        read = await session.read_resource("toy://config")
        prompt = await session.get_prompt("configure")
    return read, prompt


async def test_an_upstreams_resources_and_prompts_reach_the_client_redacted(home: Path) -> None:
    read, prompt = await read_and_prompt(home, "--redact")
    text, blob = read.contents
    assert isinstance(text, types.TextResourceContents)
    assert isinstance(blob, types.BlobResourceContents)
    decoded = base64.b64decode(blob.blob).decode()
    [message] = prompt.messages
    assert isinstance(message.content, types.TextContent)
    shown = [text.text, decoded, message.content.text, prompt.description or ""]
    for value in shown:
        assert github_pat not in value and aws_id not in value, value
        assert value.count(MARK) == 2, value
    # Logged as what each source returned: 2 secrets in each of the two contents, and in
    # the prompt's message and its description.
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        entries = [e for e in harness.catalog.audit(TASK) if e.action == "redact"]
    replaced = {e.actor: json.loads(e.detail)["replaced"] for e in entries}
    assert replaced == {"resources/read toy://config": 4, "prompts/get configure": 4}


async def test_without_redaction_resources_and_prompts_pass_as_they_came(home: Path) -> None:
    read, prompt = await read_and_prompt(home, "--ttl", "1h")
    assert github_pat in read.contents[0].text
    assert github_pat in base64.b64decode(read.contents[1].blob).decode()
    assert github_pat in prompt.messages[0].content.text
