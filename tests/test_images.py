"""Images a tool returns (ToolOutput.images: a script's charts) reach the model as image
content, after the text, in each provider's shape: checked against the openai and anthropic
SDKs' own types, through the loop's models against a fake endpoint, and over MCP with the
official SDK's client. No Docker: sandbox_exec's result is made here."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp_types
import pytest
from anthropic.types import MessageParam as AnthropicMessageParam
from mcp.client.session import ClientSession
from mcp.shared.memory import create_client_server_memory_streams
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)
from openai.types.responses import ResponseInputItemParam

from spillbox import Harness, Task, loop, parse_notice
from spillbox.adapters import (
    chat_images_message,
    compact_history,
    gate_anthropic,
    gate_chat_completions,
    gate_responses,
    tool_content,
)
from spillbox.budget import IMAGE_TOKENS, Budget
from spillbox.langs import LANGS
from spillbox.loop import ScriptedModel, ToolCall, Turn, run, to_anthropic, to_responses
from spillbox.mcp.proxy import connection
from spillbox.tools import Toolset
from spillbox.types import ExecResult, Image
from test_loop import FakeServer, anthropic_reply, openai_reply, responses_reply
from test_loop import server as server  # noqa: F401 - the fixture, for the endpoint tests
from test_tools import assert_sdk_shape


def png(width: int = 2, height: int = 2) -> bytes:
    """A real PNG (8-bit greyscale), made here: signature, IHDR, one IDAT, IEND."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + bytes(range(width)) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG = png()
CHART = Image("image/png", PNG, "/sandbox/offload/chart.png")
BIG = json.dumps([{"id": i, "body": "lorem ipsum " * 60} for i in range(200)])


def test_the_png_is_a_png() -> None:
    assert PNG.startswith(b"\x89PNG\r\n\x1a\n") and PNG.endswith(b"IEND\xaeB`\x82")
    assert CHART.data_url() == "data:image/png;base64," + base64.b64encode(PNG).decode()


# The adapters: a tool's output in each provider's shape, for a loop of one's own


def test_anthropic_tool_result_holds_the_text_then_image_blocks() -> None:
    content = tool_content('{"exit_code": 0}', [CHART], "anthropic")
    block = {"type": "tool_result", "tool_use_id": "tu_1", "content": content}
    assert content == [
        {"type": "text", "text": '{"exit_code": 0}'},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": CHART.base64()},
        },
    ]
    assert_sdk_shape({"role": "user", "content": [block]}, AnthropicMessageParam)


def test_responses_output_is_input_text_then_input_image() -> None:
    output = tool_content('{"exit_code": 0}', [CHART], "responses")
    item = {"type": "function_call_output", "call_id": "fc_1", "output": output}
    assert output == [
        {"type": "input_text", "text": '{"exit_code": 0}'},
        {"type": "input_image", "image_url": CHART.data_url(), "detail": "auto"},
    ]
    assert_sdk_shape(item, ResponseInputItemParam)


def test_without_images_the_content_is_the_text() -> None:
    assert tool_content("42", (), "anthropic") == tool_content("42", (), "responses") == "42"
    assert chat_images_message([("c1", ()), ("c2", ())]) is None


def test_chat_completions_images_go_in_a_user_message_naming_call_and_path() -> None:
    jpeg = Image("image/jpeg", b"\xff\xd8\xff\xe0 not decoded here", "/sandbox/offload/b.jpg")
    tool = {"role": "tool", "tool_call_id": "c1", "content": '{"exit_code": 0}'}
    assert_sdk_shape(tool, ChatCompletionToolMessageParam)
    message = chat_images_message([("c1", [CHART]), ("c2", ()), ("c3", [jpeg])])
    assert message is not None
    assert_sdk_shape(message, ChatCompletionUserMessageParam)
    parts = message["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text", "image_url"]
    assert "c1" in parts[0]["text"] and CHART.path in parts[0]["text"]
    assert "c3" in parts[2]["text"] and jpeg.path in parts[2]["text"]
    assert parts[1]["image_url"] == {"url": CHART.data_url(), "detail": "auto"}
    assert parts[3]["image_url"]["url"].startswith("data:image/jpeg;base64,")


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        harness.backend.languages = LANGS  # sandbox_exec is offered; its exec is made here
        with harness.task("images") as task:
            yield task


def test_the_gates_keep_a_results_images_when_its_text_is_offloaded(task: Task) -> None:
    """An offloaded result's text becomes the notice; its images stay, after it, and the
    message is still valid for the SDK."""
    output = tool_content(BIG, [CHART], "responses")
    items = [
        {"type": "function_call", "call_id": "fc_1", "name": "sandbox_exec", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "fc_1", "output": output},
    ]
    gated = gate_responses(task, items)[1]
    assert parse_notice(gated["output"][0]["text"]) is not None
    assert gated["output"][0]["type"] == "input_text"
    assert gated["output"][1:] == items[1]["output"][1:]
    assert_sdk_shape(gated, ResponseInputItemParam)

    content = tool_content(BIG, [CHART], "anthropic")
    block = {"type": "tool_result", "tool_use_id": "tu_1", "content": content}
    [gated_block] = gate_anthropic(task, [block])
    assert parse_notice(gated_block["content"][0]["text"]) is not None
    assert gated_block["content"][1:] == block["content"][1:]
    assert_sdk_shape({"role": "user", "content": [gated_block]}, AnthropicMessageParam)

    # Chat Completions: the tool message is text; the images' message is not a tool's.
    tools = [{"role": "tool", "tool_call_id": "c1", "content": BIG}]
    [gated_tool] = gate_chat_completions(task, tools)
    assert parse_notice(gated_tool["content"]) is not None
    message = chat_images_message([("c1", [CHART])])
    assert_sdk_shape([gated_tool, message], list[ChatCompletionMessageParam])


# The loop: sandbox_exec's images in the history, and in each model's request


def exec_with_chart(task: Task, monkeypatch: pytest.MonkeyPatch, output: str = "done\n") -> None:
    """task.exec returns what a script that saved a chart returns (made here: no Docker)."""

    def exec_(lang: str, code: str, **_: Any) -> ExecResult:
        return ExecResult(0, output, "", False, None, False, False, images=(CHART,))

    monkeypatch.setattr(task, "exec", exec_)


PLOT = {"lang": "python", "code": "plot()", "artifact": None, "timeout": None}


def plot_then_answer(messages: Sequence[Mapping[str, Any]]) -> Turn:
    if messages[-1]["role"] == "user":
        return Turn("Plotting.", (ToolCall("c1", "sandbox_exec", PLOT),))
    return Turn("Here is the chart.")


def looped(task: Task, monkeypatch: pytest.MonkeyPatch, output: str = "done\n") -> Any:
    exec_with_chart(task, monkeypatch, output)
    return run(task, ScriptedModel(plot_then_answer), "Chart the sales.", system="Be brief.")


def test_the_loop_keeps_the_image_in_the_tool_message_and_each_shape_shows_it(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = looped(task, monkeypatch)
    assert result.answer == "Here is the chart."
    [tool] = [m for m in result.messages if m["role"] == "tool"]
    text, image = tool["content"]
    assert json.loads(text["text"])["output"] == "done\n"
    assert image["image_url"]["url"] == CHART.data_url() and image["path"] == CHART.path
    # The image counts as one, not as its base64 text.
    assert result.context_tokens < IMAGE_TOKENS + 1_000

    chat = loop.to_chat_completions(result.messages)
    assert_sdk_shape(chat, list[ChatCompletionMessageParam])
    roles = [m["role"] for m in chat]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant"]
    assert chat[3]["content"] == text["text"]  # the tool message: text only
    caption, shown = chat[4]["content"]
    assert "c1" in caption["text"] and CHART.path in caption["text"]
    assert shown == {"type": "image_url", "image_url": {"url": CHART.data_url(), "detail": "auto"}}

    _, items = to_responses(result.messages)
    [output] = [i for i in items if i.get("type") == "function_call_output"]
    assert_sdk_shape(items, list[ResponseInputItemParam])
    assert output["output"] == [
        {"type": "input_text", "text": text["text"]},
        {"type": "input_image", "image_url": CHART.data_url(), "detail": "auto"},
    ]

    _, messages = to_anthropic(result.messages)
    assert_sdk_shape(messages, list[AnthropicMessageParam])
    [block] = messages[2]["content"]
    assert block["type"] == "tool_result" and block["content"][0]["text"] == text["text"]
    assert base64.b64decode(block["content"][1]["source"]["data"]) == PNG


def test_an_offloaded_output_keeps_its_image_after_the_notice(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = looped(task, monkeypatch, output=BIG)
    [tool] = [m for m in result.messages if m["role"] == "tool"]
    assert result.steps[0].admitted[0].offloaded
    assert parse_notice(tool["content"][0]["text"]) is not None
    assert tool["content"][1]["path"] == CHART.path
    # Compacting the history later keeps it too.
    compacted = compact_history(task, result.messages, keep_last=0)
    [tool_after] = [m for m in compacted if m["role"] == "tool"]
    assert tool_after["content"][1:] == tool["content"][1:]


@pytest.mark.parametrize("provider", ["chat_completions", "responses", "anthropic"])
def test_the_budget_counts_an_image_as_image_tokens_in_tool_results(
    task: Task, monkeypatch: pytest.MonkeyPatch, provider: str
) -> None:
    messages = looped(task, monkeypatch).messages
    request: dict[str, Any]
    if provider == "chat_completions":
        request = {"messages": loop.to_chat_completions(messages)}
        route = "history"  # Chat Completions shows it in a user message
    elif provider == "responses":
        request = {"input": to_responses(messages)[1]}
        route = "tool_results"
    else:
        request = {"messages": to_anthropic(messages)[1]}
        route = "tool_results"
    with_image = Budget(window=100_000).measure(request, provider)  # type: ignore[arg-type]
    assert with_image.route(route).used >= IMAGE_TOKENS
    assert with_image.route("tool_results").used < IMAGE_TOKENS + 200
    history = Budget(window=100_000).measure({"messages": messages}, "chat_completions")
    assert IMAGE_TOKENS <= history.route("tool_results").used < IMAGE_TOKENS + 200


def test_each_model_sends_the_image_in_its_providers_shape(
    server: FakeServer,  # noqa: F811 - the fixture imported above
    task: Task,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the SDKs to a fake endpoint: what goes over the wire holds the image."""
    messages = looped(task, monkeypatch).messages
    server.replies += [
        (200, openai_reply("ok")),
        (200, responses_reply([{"type": "message", "role": "assistant", "content": []}])),
        (200, anthropic_reply("ok")),
    ]
    tools = Toolset(task).specs()
    loop.OpenAIChatModel(server.endpoint("openai", "/v1/")).respond(messages, tools)
    loop.OpenAIResponsesModel(server.endpoint("openai", "/v1/")).respond(messages, tools)
    loop.AnthropicModel(server.endpoint("anthropic")).respond(messages, tools)
    chat, responses, anthropic = (request["body"] for request in server.requests)
    assert chat["messages"] == loop.to_chat_completions(messages)
    assert chat["messages"][-2]["content"][1]["image_url"]["url"] == CHART.data_url()
    assert responses["input"] == to_responses(messages)[1]
    assert anthropic["messages"] == to_anthropic(messages)[1]


# MCP: spillbox's own tools (spillbox mcp serve, and beside a proxied server)


def test_an_mcp_client_receives_the_image_after_the_text(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    exec_with_chart(task, monkeypatch)
    received: list[mcp_types.CallToolResult] = []

    async def main() -> None:
        async with (
            connection(task, None) as proxy,
            create_client_server_memory_streams() as (client, server_streams),
            anyio.create_task_group() as group,
        ):
            group.start_soon(proxy.server.run, *server_streams, proxy.options())
            async with ClientSession(*client) as session:
                await session.initialize()
                received.append(await session.call_tool("sandbox_exec", PLOT))
                big = {**PLOT, "code": "print(big)"}
                exec_with_chart(task, monkeypatch, output=BIG)
                received.append(await session.call_tool("sandbox_exec", big))
            group.cancel_scope.cancel()

    anyio.run(main)
    small, offloaded = received
    text, image = small.content
    assert isinstance(text, mcp_types.TextContent) and json.loads(text.text)["exit_code"] == 0
    assert isinstance(image, mcp_types.ImageContent) and image.mime_type == "image/png"
    assert base64.b64decode(image.data) == PNG
    # Offloaded: the notice, the link to the payload, then the image.
    notice, link, image = offloaded.content
    assert isinstance(notice, mcp_types.TextContent) and parse_notice(notice.text) is not None
    assert isinstance(link, mcp_types.ResourceLink)
    assert isinstance(image, mcp_types.ImageContent) and base64.b64decode(image.data) == PNG
