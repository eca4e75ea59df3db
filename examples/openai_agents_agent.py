"""spillbox in an OpenAI Agents SDK agent, offline: a scripted model (the SDK's own
agents.testing.ScriptedModel) calls a tool that returns 400 orders (~25k tokens), gets
spillbox's notice in their place, asks sandbox_exec for the open orders' total with the SQL
the notice suggests, and answers with it.

    make image && python examples/openai_agents_agent.py [--home DIR]

It prints what the model received at each turn and the answer, checked against the data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tempfile
from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.testing import ModelCall, ModelStep, ScriptedModel
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from spillbox import Harness, Retention, parse_notice
from spillbox.integrations.openai_agents import run

ORDERS = [
    {"id": i, "status": "open" if i % 4 else "shipped", "amount": i * 7 % 500, "note": "x" * 300}
    for i in range(400)
]


@function_tool
def list_orders() -> str:
    """Every order of the shop, as JSON."""
    return json.dumps(ORDERS)


def outputs(call: ModelCall) -> dict[str, Any]:
    """The tool outputs the model received, by call id."""
    return {
        item["call_id"]: item["output"]
        for item in call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    }


def total_sql(notice: str) -> str:
    """The notice's SQL hint turned to the question: the table the hint names."""
    fields = parse_notice(notice[notice.index("[spillbox") :]) or {}
    for line in fields.get("hint", "").splitlines():
        name, _, arguments = line.partition(" ")
        if name == "sandbox_exec":
            table = re.search(r"FROM\s+(\S+)", json.loads(arguments)["code"])
            if table:
                return f"SELECT sum(amount) FROM {table.group(1)} WHERE status = 'open'"
    raise SystemExit(f"the notice has no SQL hint: {notice}")


def respond(call: ModelCall) -> list[Any]:
    """The model's turn, from what it received."""
    seen = outputs(call)
    print(f"\n--- model call {len(seen) + 1}, the tool outputs it received:")
    for call_id, output in seen.items():
        print(f"{call_id}: {output[:700]}")
    if "sql" in seen:
        total = json.loads(seen["sql"])["output"].strip().splitlines()[-1]
        text = f"The open orders amount to {total}."
        return [
            ResponseOutputMessage(
                id="answer",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
            )
        ]
    if "orders" in seen:
        arguments = {"lang": "sql", "code": total_sql(seen["orders"]), "artifact": None}
        arguments |= {"timeout": None, "session": None, "reset_session": None}
        return [_call("sql", "sandbox_exec", arguments)]
    return [_call("orders", "list_orders", {})]


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=call_id, name=name, arguments=json.dumps(arguments)
    )


async def main(home: str) -> int:
    model = ScriptedModel([ModelStep(responder=respond) for _ in range(3)])
    agent = Agent(name="shop", instructions="Answer with the tools.", model=model)
    agent = agent.clone(tools=[list_orders])
    with Harness(home=home) as harness:
        result = await run(
            harness,
            agent,
            "What do the open orders amount to?",
            retention=Retention(keep_after_close=0),  # the task goes when the run ends
            run_config=RunConfig(tracing_disabled=True),
        )
    print(f"\n--- answer: {result.final_output}")
    expected = sum(order["amount"] for order in ORDERS if order["status"] == "open")
    return 0 if str(expected) in str(result.final_output) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="spillbox home (default: a temporary folder)")
    args = parser.parse_args()
    if args.home:
        raise SystemExit(asyncio.run(main(args.home)))
    with tempfile.TemporaryDirectory() as home:
        raise SystemExit(asyncio.run(main(home)))
