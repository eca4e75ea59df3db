"""A budget too small for its system prompt fails loudly, before any model call.

The system route holds 300 tokens; the system prompt (a long operating manual) is about
1,400. The loop checks the budget before the first call and raises BudgetExceeded, whose
message names the route, its use, its limit and which setting to raise; nothing is cut
and the model is never called.

    python examples/budget_too_small.py     # exits 1 with the message on stderr
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spillbox import Harness
from spillbox.budget import Budget, BudgetExceeded, default_routes
from spillbox.loop import ScriptedModel, Turn, run

WINDOW = 8_000
MANUAL = " ".join(
    f"Rule {n}: before you change a release branch, read its CHANGELOG, run the full test "
    f"suite, and ask the on-call engineer for approval in the release channel."
    for n in range(1, 41)
)


def never(messages: Sequence[Mapping[str, Any]]) -> Turn:
    raise AssertionError("the model must not be called over a hard limit")


def main() -> int:
    budget = Budget(window=WINDOW, routes={**default_routes(WINDOW), "system": 300})
    print(f"system route: {budget.route('system').limit} tokens; the prompt is about "
          f"{budget.counter.count(MANUAL):,}")  # fmt: skip
    with tempfile.TemporaryDirectory() as home:
        with Harness(sandbox="none", home=Path(home), environ={}, gc_interval=-1) as harness:
            with harness.task("too-small") as task:
                try:
                    run(task, ScriptedModel(never), "Cut the 2.4 release.", system=MANUAL,
                        budget=budget)  # fmt: skip
                except BudgetExceeded as error:
                    print(f"BudgetExceeded: {error}", file=sys.stderr)
                    return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
