"""spillbox in a LangChain agent, offline: create_agent with SpillboxMiddleware and a fake
chat model that acts on what it is given.

The agent's tool lists 90 orders (about 8,000 tokens, over the 6,000-token per-call limit).
The model gets a notice in its place, asks the task's sandbox for the open orders' total with
the SQL the notice suggests (DuckDB, in Docker), and answers with the number it printed.

    make image && python examples/langchain_agent.py
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from spillbox import Harness, parse_notice
from spillbox.integrations.langchain import SpillboxMiddleware

ORDERS = json.dumps(
    [
        {"id": i, "status": "open" if i % 3 else "closed", "amount": (i * 37) % 1000,
         "note": "lorem ipsum dolor sit amet " * 12}
        for i in range(90)
    ]
)  # fmt: skip


@tool
def list_orders() -> str:
    """All orders, as a JSON array."""
    return ORDERS


class NoticeReader(GenericFakeChatModel):
    """A fake model: list the orders; run the notice's SQL hint, summing the open ones;
    answer with what the query printed."""

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.turn(messages))])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> NoticeReader:  # type: ignore[override]
        return self

    @staticmethod
    def turn(messages: Sequence[BaseMessage]) -> AIMessage:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results:
            call = {"name": "list_orders", "args": {}, "id": "c1", "type": "tool_call"}
            return AIMessage(content="", tool_calls=[call])
        last = str(results[-1].content)
        if len(results) == 1:
            notice = parse_notice(last)
            print(f"the model got a notice of {len(last)} characters:\n{last}\n")
            assert notice is not None
            hint = next(h for h in notice["hint"].splitlines() if h.startswith("sandbox_exec"))
            table = json.loads(hint.partition(" ")[2])["code"].split("FROM ")[1]
            sql = f"SELECT sum(amount) FROM {table} WHERE status = 'open'"
            args = {"lang": "sql", "code": sql, "artifact": None}
            call = {"name": "sandbox_exec", "args": args, "id": "c2", "type": "tool_call"}
            return AIMessage(content="", tool_calls=[call])
        printed = json.loads(last)["output"]
        return AIMessage(content=f"The open orders add up to {printed.split()[-1]}.")


def main() -> None:
    with tempfile.TemporaryDirectory() as home:
        with Harness(sandbox="docker", home=Path(home), gc_interval=-1) as harness:
            spillbox = SpillboxMiddleware(harness)
            model = NoticeReader(messages=iter(()))
            agent = create_agent(model, [list_orders], middleware=[spillbox])
            config: Any = {"configurable": {"thread_id": "orders-report"}}
            final = agent.invoke({"messages": [("user", "What do open orders add up to?")]}, config)
            print(final["messages"][-1].content)
            harness.remove("orders-report")


if __name__ == "__main__":
    main()
