"""A Google ADK agent whose tool results pass spillbox's gate, offline (a scripted BaseLlm).

The agent's model asks for 90 orders (about 8k tokens, over the per-call limit): spillbox
stores them in the task's Docker sandbox and the model gets a notice instead. The model
then runs the notice's SQL hint, changed to sum the open orders, with sandbox_exec, and
answers with the total.

    make image && python examples/google_adk_agent.py
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from google.adk.agents.llm_agent import LlmAgent
from google.adk.apps import App
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types

from spillbox import Harness, parse_notice
from spillbox.integrations.google_adk import SpillboxPlugin

ORDERS = [
    {"id": i, "status": "open" if i % 3 else "closed", "amount": (i * 37) % 1000, "note": "x" * 300}
    for i in range(90)
]


def list_orders() -> str:
    """All orders, as a JSON array."""
    return json.dumps(ORDERS, indent=1)


def _responses(request: LlmRequest) -> dict[str, Any]:
    return {
        part.function_response.name: part.function_response.response
        for content in request.contents
        for part in content.parts or []
        if part.function_response is not None
    }


def _reply(*parts: types.Part) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=list(parts)))


class ScriptedModel(BaseLlm):
    """Stands in for Gemini: reads what it was given, and answers as a model would."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncIterator[LlmResponse]:
        got = _responses(llm_request)
        if "list_orders" not in got:
            yield _reply(types.Part.from_function_call(name="list_orders", args={}))
        elif "sandbox_exec" not in got:
            text = got["list_orders"]["result"]
            print(f"the model sees, for list_orders:\n{text}\n")
            notice = parse_notice(text[: text.index("[/spillbox]") + len("[/spillbox]")])
            [table] = [line for line in notice["hint"].splitlines() if '"sql"' in line]
            name = json.loads(table.partition(" ")[2])["code"].split("FROM ")[1]
            sql = f"SELECT sum(amount) AS total FROM {name} WHERE status = 'open'"
            args = {"lang": "sql", "code": sql, "artifact": None, "timeout": None}
            args |= {"session": None, "reset_session": None}
            yield _reply(types.Part.from_function_call(name="sandbox_exec", args=args))
        else:
            output = json.loads(got["sandbox_exec"]["result"])["output"]
            yield _reply(types.Part(text=f"The open orders total {output.split()[-1]}."))


async def main() -> None:
    with tempfile.TemporaryDirectory() as home:
        with Harness(sandbox="docker", home=Path(home), gc_interval=-1) as harness:
            spillbox = SpillboxPlugin(harness)
            agent = LlmAgent(
                name="analyst", model=ScriptedModel(), tools=[list_orders, spillbox.toolset()]
            )
            runner = InMemoryRunner(app=App(name="shop", root_agent=agent, plugins=[spillbox]))
            session = await runner.session_service.create_session(app_name="shop", user_id="u")
            message = types.Content(role="user", parts=[types.Part(text="Open orders total?")])
            async for event in runner.run_async(
                user_id="u", session_id=session.id, new_message=message
            ):
                if event.is_final_response() and event.content and event.content.parts:
                    print("the agent answers:", event.content.parts[0].text)
            expected = sum(o["amount"] for o in ORDERS if o["status"] == "open")
            print(f"(the exact total is {expected})")
            await spillbox.end_session(session)  # the task's retention applies now
            await runner.close()


if __name__ == "__main__":
    asyncio.run(main())
