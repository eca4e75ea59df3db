"""A PydanticAI agent with spillbox: a tool returns 300 orders (about 12k tokens); the model
gets a notice in their place and answers with one DuckDB query in the task's sandbox.

Run with `python examples/pydantic_ai_agent.py [--home DIR]` after `make image` (needs
Docker, no network: the model is PydanticAI's FunctionModel, scripted to read what it is
sent). It prints each tool result as the model received it, then the answer.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from spillbox import Harness, parse_notice
from spillbox.integrations.pydantic_ai import Spillbox

ORDERS = [
    {"id": i, "status": "open" if i % 3 else "closed", "amount": (i * 37) % 1000, "note": "x" * 200}
    for i in range(300)
]


def list_orders() -> list[dict[str, Any]]:
    """Every order, with its status and amount."""
    return ORDERS


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A scripted model: list the orders, query the notice's table, answer."""
    last = messages[-1]
    returned = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if isinstance(last, ModelRequest) and not returned:
        return ModelResponse(parts=[ToolCallPart("list_orders", {}, "orders")])
    [result] = returned
    if result.tool_name == "list_orders":
        notice = parse_notice(str(result.content))
        assert notice is not None, "the orders were small enough to stay inline"
        table = notice["path"].rsplit("/", 1)[-1].split(".")[0]
        sql = f"SELECT sum(amount) AS total FROM \"{table}\" WHERE status = 'open'"
        return ModelResponse(parts=[ToolCallPart("sandbox_exec", {"lang": "sql", "code": sql})])
    total = json.loads(str(result.content))["output"].split()[1]
    return ModelResponse(parts=[TextPart(f"The open orders total {total}.")])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="spillbox's home (default: a temporary folder)")
    home = parser.parse_args().home or tempfile.mkdtemp(prefix="spillbox-pydantic-ai-")
    with Harness(sandbox="docker", home=home) as harness:
        agent = Agent(FunctionModel(model), capabilities=[Spillbox(harness, task_id="orders")])
        agent.tool_plain(list_orders)
        result = agent.run_sync("What do the open orders total?")
        for message in result.all_messages():
            for part in message.parts:
                if isinstance(part, ToolReturnPart):
                    print(f"--- {part.tool_name} (what the model received)\n{part.content}\n")
        print(f"--- answer\n{result.output}")
        harness.existing("orders").close(delete=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
