"""OpenAI Agents SDK: one Runner.run of a ScriptedModel turn that makes one small call, then
one that answers: without spillbox, with spillbox's tools offered but no gate (what the SDK
itself spends on four more tools), and with SpillboxRun's agent and call_model_input_filter,
the row judged. The filter's own time is measured inside the runs with spillbox (every call
of it in one run), so it holds none of the framework's noise."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

from frameworks import Row, alternate, event_loop, harness, timed

RUNS = 300
QUICK_RUNS = 30
FRAMEWORK = "OpenAI Agents SDK"
NOTE = (
    "a Runner.run of a ScriptedModel turn of one call and one that answers; the middle row "
    "offers spillbox's tools without its filter; the filter's own time is taken inside the "
    "runs with spillbox."
)


def rows(quick: bool) -> list[Row]:
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.run_config import CallModelData, ModelInputData
    from agents.testing import ModelCall, ModelStep, ScriptedModel
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    from spillbox.integrations.openai_agents import SpillboxRun

    ids = itertools.count()

    def respond(call: ModelCall) -> list[Any]:
        if any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in call.input):
            text = ResponseOutputText(type="output_text", text="pong", annotations=[])
            message = ResponseOutputMessage(
                id="m", type="message", role="assistant", status="completed", content=[text]
            )
            return [message]
        # A new call id each run: the filter never takes one run's output for another's.
        ping = ResponseFunctionToolCall(
            type="function_call", call_id=f"c{next(ids)}", name="ping", arguments="{}"
        )
        return [ping]

    @function_tool
    def ping() -> str:
        """Is the service up?"""
        return json.dumps({"ok": True})

    model = ScriptedModel()
    agent = Agent(name="bench", model=model, tools=[ping])
    plain = RunConfig(tracing_disabled=True)
    runs = QUICK_RUNS if quick else RUNS
    hook: list[float] = []
    """The filter's ms in each run with spillbox, warm-up runs first."""
    with harness() as made, event_loop() as run:
        stack = AsyncExitStack()
        spill = run(stack.enter_async_context(SpillboxRun.open(made, agent, task_id="bench")))

        async def timed_filter(data: CallModelData[Any]) -> ModelInputData:
            started = time.perf_counter()
            filtered = await spill.input_filter(data)
            hook[-1] += (time.perf_counter() - started) * 1000
            return filtered

        gated = replace(plain, call_model_input_filter=timed_filter)
        cases = [(agent, plain), (spill.agent, plain), (spill.agent, gated)]

        def before() -> None:
            """Untimed: each run's two model steps, and the gated run's hook time at 0."""
            model.extend([ModelStep(responder=respond)] * 2 * len(cases))
            hook.append(0.0)

        try:
            without, tools, with_ = alternate(
                [
                    timed(lambda case=case: run(Runner.run(case[0], "ping?", run_config=case[1])))
                    for case in cases
                ],
                runs,
                before=before,
            )
        finally:
            run(stack.aclose())
    in_hook = statistics.median(hook[-runs:])
    return [
        Row(
            FRAMEWORK,
            "Runner.run, one call (SpillboxRun's agent and filter)",
            without,
            with_,
            runs,
            judged=True,
        ),
        Row(FRAMEWORK, "spillbox's tools offered, no filter", without, tools, runs),
        Row(FRAMEWORK, "call_model_input_filter alone, inside the runs above", 0.0, in_hook, runs),
    ]
