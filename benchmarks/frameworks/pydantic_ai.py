"""PydanticAI: Agent.run with a FunctionModel that makes one, then TURNS, model turns of one
small call each, then answers, without and with the Spillbox capability. Per call is what
each more turn adds to a run (the slope between the two), the row judged; a run's own cost,
opening and closing its task, is in the row of a run of one call. The last row leaves
spillbox's tools out: what the hooks and the gate add, apart from PydanticAI's own cost of
offering more tools at every model turn."""

from __future__ import annotations

from typing import Any

from frameworks import SMALL, Row, alternate, event_loop, harness, timed

RUNS = 60
QUICK_RUNS = 6
WARMUP_RUNS = 3
TURNS = 20
FRAMEWORK = "PydanticAI"
NOTE = (
    f"per call is the slope between runs of 1 and of {TURNS} model turns of one call each "
    "(what each more turn adds); a run of one call also opens and closes its task."
)


def rows(quick: bool) -> list[Row]:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from spillbox.integrations.pydantic_ai import Spillbox

    class HooksOnly(Spillbox):
        """The capability without its tools: what the hooks and the gate add, apart from
        what PydanticAI spends on every tool it offers, at each model turn."""

        def get_toolset(self) -> None:  # type: ignore[override]
            return None

    def agents(turns: int, spillbox: Spillbox) -> list[Any]:
        def model(messages: list[Any], info: Any) -> ModelResponse:
            done = sum(isinstance(m, ModelResponse) for m in messages)
            if done < turns:
                return ModelResponse(parts=[ToolCallPart("ping", {}, f"c{done}")])
            return ModelResponse(parts=[TextPart("done")])

        made = []
        for capabilities in ([], [spillbox]):
            agent = Agent(FunctionModel(model), capabilities=capabilities)
            agent.tool_plain(name="ping")(lambda: SMALL)
            made.append(agent)
        return made

    runs = QUICK_RUNS if quick else RUNS
    medians: dict[tuple[str, int], list[float]] = {}
    with harness() as made, event_loop() as run:
        for kind, capability in (("whole", Spillbox), ("hooks", HooksOnly)):
            for turns in (1, TURNS):
                sides = agents(turns, capability(made, task_id=kind))
                medians[kind, turns] = alternate(
                    [timed(lambda agent=agent: run(agent.run("go"))) for agent in sides],
                    runs,
                    warmup=WARMUP_RUNS,
                )

    def slope(kind: str) -> list[float]:
        """What each more turn of one call adds to a run, on each side: a call's cost (the
        task's open and close are the run's)."""
        one, many = medians[kind, 1], medians[kind, TURNS]
        return [(many[i] - one[i]) / (TURNS - 1) for i in (0, 1)]

    return [
        Row(
            FRAMEWORK,
            "Agent.run of one call (a task opened and closed)",
            *medians["whole", 1],
            runs,
        ),
        Row(
            FRAMEWORK,
            "Agent.run, per call (a model turn of one call)",
            *slope("whole"),
            runs,
            judged=True,
        ),
        Row(FRAMEWORK, "per call, hooks and gate only (no tools offered)", *slope("hooks"), runs),
    ]
