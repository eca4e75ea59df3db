"""spillbox inside the Claude Agent SDK, offline: the real `claude` CLI (from `make install`)
talks to a local fake Messages API that scripts the model.

The model calls a tool of its own (an in-process MCP server "shop") whose result is about
7k tokens, over the per-call limit: the PostToolUse hook puts spillbox's notice in its
place and stores the payload in the task's sandbox. The model then queries the payload's
table with mcp__spillbox__sandbox_exec (DuckDB SQL) and answers from the result.

    make image && python examples/claude_agent.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    TextBlock,
    ToolAnnotations,
    create_sdk_mcp_server,
    query,
    tool,
)

from spillbox import Harness, parse_notice
from spillbox.integrations.claude_agent import OFFLINE_ENV, SpillboxSession
from spillbox.integrations.fake_messages import FakeMessagesAPI, text, tool_use

ORDERS = json.dumps(
    [
        {"id": i, "status": "open" if i % 3 else "closed", "amount": (i * 37) % 1000,
         "note": "lorem ipsum dolor sit amet " * 10}
        for i in range(90)
    ]
)  # fmt: skip


@tool("list_orders", "Every order.", {}, annotations=ToolAnnotations(readOnlyHint=True))
async def list_orders(arguments: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": ORDERS}]}


def last_result(body: dict[str, Any]) -> str:
    [block] = [b for b in body["messages"][-1]["content"] if b.get("type") == "tool_result"]
    content = block["content"]
    return content if isinstance(content, str) else content[0]["text"]


def model() -> FakeMessagesAPI:
    """The scripted model: list the orders, query the stored payload, answer."""

    def sql(body: dict[str, Any]) -> list[dict[str, Any]]:
        shown = last_result(body)
        print(f"the model got, in place of {len(ORDERS):,} characters of orders:\n{shown}\n")
        notice = parse_notice(shown[shown.index("[spillbox") :]) or {}
        table = notice["path"].rsplit("/", 1)[-1].split(".")[0]
        code = f"SELECT sum(amount) AS total FROM \"{table}\" WHERE status = 'open'"
        return [tool_use("q", "mcp__spillbox__sandbox_exec", {"lang": "sql", "code": code})]

    def answer(body: dict[str, Any]) -> list[dict[str, Any]]:
        output = json.loads(last_result(body))["output"]
        return [text(f"The open orders total {output.split()[-1]}.")]

    return FakeMessagesAPI(
        [lambda body: [tool_use("c1", "mcp__shop__list_orders", {})], sql, answer]
    )


async def main() -> None:
    fake = model()
    with tempfile.TemporaryDirectory() as tmp:
        options = ClaudeAgentOptions(
            mcp_servers={"shop": create_sdk_mcp_server("shop", tools=[list_orders])},
            allowed_tools=["mcp__shop__list_orders"],
            tools=[],
            permission_mode="dontAsk",
            setting_sources=[],
            cwd=tmp,
            env={
                **OFFLINE_ENV,
                "ANTHROPIC_BASE_URL": fake.url,
                "ANTHROPIC_API_KEY": "sk-fake",
                "HOME": tmp,
            },  # fmt: skip
        )
        with Harness(sandbox="docker", home=Path(tmp) / "spillbox", gc_interval=-1) as harness:
            async with SpillboxSession(harness, options) as spill:
                async for message in query(prompt="Sum the open orders.", options=spill.options):
                    if isinstance(message, AssistantMessage):
                        for block in message.content:
                            if isinstance(block, TextBlock):
                                print(f"answer: {block.text}")
                print(f"task {spill.task.id}: {len(spill.task.artifacts())} artifact(s) stored")
            harness.remove(spill.task.id, by="manual")
    fake.close()
    expected = sum(row["amount"] for row in json.loads(ORDERS) if row["status"] == "open")
    print(f"(the exact total is {expected})")


if __name__ == "__main__":
    anyio.run(main)
