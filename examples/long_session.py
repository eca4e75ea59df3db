"""A long session inside a 32k window: a scripted model reads 45 large results, one a
step, under a token budget checked before every model call.

It runs the session twice:

- native: the model is claude-sonnet-4-6, whose capability row offers Anthropic's
  compaction and tool-result clearing. A 32k window puts the compaction trigger under
  Anthropic's 50,000-token minimum, so the plan is clear_tool_uses (the request
  parameters and beta header are printed, with OpenAI's for gpt-5.4 beside them). Before
  the provider would clear them, spillbox stores the tool results in the task, and
  record_turns=True keeps every turn in the task's history (what a provider's compaction
  removes can always be read back); the model here is scripted, so no provider clears
  anything, and where the history would pass the window spillbox's own fallback runs.
- fallback: the model is gpt-4.1 on Chat Completions (no native compaction), so run()'s
  default compactor, spillbox's reversible Fallback, runs: tool results become notices,
  then (if still needed) older turns move into the task's one history.

With the default routes the conversation shares the window: compaction starts when a
request reaches 80% of what the window leaves after the output reserve.

Each step prints the budget report: tokens in, the output reserve, headroom, use and
limit per route ("!" over the soft limit), and the compaction that ran.

    python examples/long_session.py [--home DIR] [--sandbox none|docker]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spillbox import Harness
from spillbox.budget import Budget
from spillbox.history import HISTORY_REF, HISTORY_TOOL
from spillbox.loop import LoopResult, ScriptedModel, ToolCall, Turn, UserTool, run
from spillbox.native import Native, plan_native
from spillbox.tools import ToolSpec

STEPS = 45
WINDOW = 32_000
SYSTEM = "You are a release engineer. Read every page of the build log, then report."
TASK = f"Read pages 0 to {STEPS - 1} of tonight's build log and tell me which steps failed."
READ_PAGE = ToolSpec(
    "read_log_page",
    "One page of tonight's build log, as JSON records.",
    {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
)


def read_page(arguments: Mapping[str, Any]) -> str:
    """A page of ~1.5k tokens; every ninth page is ~20k tokens (the gate offloads it)."""
    page = int(arguments["page"])
    records = 400 if page % 9 == 4 else 30
    return json.dumps(
        [
            {
                "page": page,
                "step": page * 1000 + n,
                "status": "failed" if (page * 1000 + n) % 977 == 0 else "ok",
                "message": f"compiled unit {n} of page {page} in {(n * 37) % 900} ms",
            }
            for n in range(records)
        ],
        indent=1,
    )


def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
    """Ask for the next page; the latest call is always in the history, whatever moved."""
    read = [int(m["tool_call_id"].removeprefix("p")) for m in messages if m["role"] == "tool"]
    page = max(read, default=-1) + 1
    if page >= STEPS:
        return Turn(f"Read {STEPS} pages; the failed steps are in the stored pages.")
    return Turn("", (ToolCall(f"p{page}", READ_PAGE.name, {"page": page}),))


def session(harness: Harness, name: str, model: str) -> None:
    budget = Budget(window=WINDOW, model=model)
    with harness.task(f"long-session-{name}") as task:
        # The fallback session leaves compactor out: run() then uses Fallback(task).
        extra: dict[str, Any] = {}
        if name == "native":
            plan = plan_native("anthropic", model, budget)
            print(f"plan: {plan.feature} ({plan.reason})")
            print(f"  request parameters: {json.dumps(plan.params)}  betas: {list(plan.betas)}")
            openai = plan_native("responses", "gpt-5.4", budget)
            print(f"  gpt-5.4 on Responses would get: {json.dumps(openai.params)}")
            extra = {"compactor": Native(task, plan), "record_turns": True}
        else:
            print(f"plan: {plan_native('chat_completions', model, budget).reason}")
        result = run(
            task,
            ScriptedModel(script),
            TASK,
            tools=[UserTool(READ_PAGE, read_page)],
            system=SYSTEM,
            max_steps=STEPS + 5,
            budget=budget,
            **extra,
        )
        for step, report in enumerate(result.reports):
            print(f"step {step:2d}: {report}")
        kept = [a for a in task.artifacts() if a.tool == HISTORY_TOOL]
        lines = task.read(HISTORY_REF).count(b"\n") if kept else 0
        highest = max(r.input_tokens for r in result.reports)
        print(
            f"answer: {result.answer}\n"
            f"{len(result.steps)} tool steps; the largest request {highest:,} tokens of the "
            f"{budget.input_limit:,} the window leaves after the output reserve; "
            f"{first_compaction(result)}; {len(task.artifacts())} artifacts in the task "
            f"(the task's history: {lines} turns in {len(kept)} artifact, appended to in "
            "place), all readable with read_artifact\n"
        )


def first_compaction(result: LoopResult) -> str:
    """How full the request before the first compaction was."""
    for before, report in zip(result.reports, result.reports[1:], strict=False):
        if any(stage.freed > 0 for stage in report.stages):
            limit = before.window - before.reserve_output
            return (
                f"the first compaction ran after a request of {before.input_tokens:,} tokens "
                f"({before.input_tokens / limit:.0%} of {limit:,})"
            )
    return "no compaction freed any tokens"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="spillbox home (default: a temporary one)")
    parser.add_argument("--sandbox", choices=("none", "docker"), default="none")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        home = args.home or Path(scratch)
        with Harness(sandbox=args.sandbox, home=home, environ={}, gc_interval=-1) as harness:
            for name, model in (("native", "claude-sonnet-4-6"), ("fallback", "gpt-4.1")):
                print(f"== {name}: {model}, window {WINDOW:,}")
                session(harness, name, model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
