"""Google ADK: one Runner.run_async of a scripted BaseLlm that calls the small tool once and
then answers, with and without SpillboxPlugin and spillbox's toolset among the agent's tools,
the row judged; each run in the same session, emptied of its history between rounds
(untimed), whose task spillbox opens once. A second row leaves spillbox's tools out: what the
gate costs apart from what ADK spends on four more tools offered at each model call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from frameworks import SMALL, Row, alternate, event_loop, harness, timed

CALLS = 300
QUICK_CALLS = 40
FRAMEWORK = "Google ADK"
NOTE = (
    "one Runner.run_async of a scripted BaseLlm that calls the tool once, then answers, in a "
    "session emptied between runs; the second row offers none of spillbox's tools."
)


def rows(quick: bool) -> list[Row]:
    from google.adk.agents.llm_agent import LlmAgent
    from google.adk.apps import App
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    from spillbox.integrations.google_adk import SpillboxPlugin

    class OneCall(BaseLlm):
        """Calls ping when the last message is the user's, answers once it has the result."""

        model: str = "one-call"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncIterator[LlmResponse]:
            last = llm_request.contents[-1].parts or []
            if any(part.function_response is not None for part in last):
                part = types.Part(text="done")
            else:
                part = types.Part.from_function_call(name="ping", args={})
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    def ping() -> str:
        """Answers a small result."""
        return SMALL

    message = types.Content(role="user", parts=[types.Part(text="ping")])

    async def once(runner: InMemoryRunner) -> None:
        async for _ in runner.run_async(user_id="u", session_id="s", new_message=message):
            pass

    async def fresh(runner: InMemoryRunner) -> None:
        """The session again without its history, so that every run runs the same (spillbox
        keeps the session's task: it knows the session by its app, user and id)."""
        service = runner.session_service
        await service.delete_session(app_name="bench", user_id="u", session_id="s")
        await service.create_session(app_name="bench", user_id="u", session_id="s")

    def runner(tools: list[Any], plugins: list[Any]) -> InMemoryRunner:
        agent = LlmAgent(name="a", model=OneCall(), tools=tools)
        return InMemoryRunner(app=App(name="bench", root_agent=agent, plugins=plugins))

    calls = QUICK_CALLS if quick else CALLS
    made_rows = []
    with harness() as made, event_loop() as run:
        spillbox = SpillboxPlugin(made)
        gated = {
            "Runner.run_async, one call (SpillboxPlugin and its tools)": [spillbox.toolset()],
            "the same, SpillboxPlugin alone (the gate, no tools offered)": [],
        }
        for path, extra in gated.items():
            sides = [runner([ping], []), runner([ping, *extra], [spillbox])]
            medians = alternate(
                [timed(lambda side=side: run(once(side))) for side in sides],
                calls,
                before=lambda sides=sides: [run(fresh(side)) for side in sides],
            )
            made_rows.append(Row(FRAMEWORK, path, *medians, calls, judged=bool(extra)))
            for side in sides:
                run(side.close())
    return made_rows
