"""A multi-step analysis in the task's persistent Python session: a sales API returns 5,000
orders (offloaded); the model loads them into a pyarrow table once, then, call after call,
reuses that table (and a helper it defined) without loading it again.

Run with `python examples/session_analysis.py [--home DIR]` (needs Docker; builds the sandbox
image if it is missing). It prints the conversation as the model saw it: the notice, each
sandbox_exec call with session true, and what came back. The model is scripted (no key).

Charts coming back as images (issue 13, item 3) are not built yet: this example prints its
figures as text.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spillbox import Harness
from spillbox.loop import ScriptedModel, ToolCall, Turn, UserTool, run
from spillbox.tools import ToolSpec

REGIONS = ("north", "south", "east", "west")


def orders(n: int = 5_000, seed: int = 7) -> str:
    rng = random.Random(seed)
    return json.dumps(
        [
            {
                "id": i,
                "region": rng.choice(REGIONS),
                "month": f"2026-{rng.randint(1, 12):02d}",
                "amount": round(rng.uniform(5, 500), 2),
                "note": "customer asked for a follow-up call about the delivery window",
            }
            for i in range(n)
        ]
    )


CELLS = [
    # Step 1: load once, keep the table and a helper in the session.
    "orders = con.sql('SELECT * FROM \"orders_1\"').to_arrow_table()\n"
    "def by(column):\n"
    "    return con.sql(f'SELECT {column}, round(sum(amount), 2) AS total "
    "FROM orders GROUP BY 1 ORDER BY 2 DESC').fetchall()\n"
    "orders.num_rows",
    # Step 2: the table and the helper are still there.
    "by('region')",
    # Step 3: and again, a different cut of the same table.
    "best = by('month')[0]\nbest",
]


def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
    """Call the orders API, then run the cells one per step, then answer."""
    calls = sum(1 for m in messages if m.get("role") == "assistant")
    if calls == 0:
        return Turn(tool_calls=(ToolCall("orders_1", "list_orders", {}),))
    if calls <= len(CELLS):
        code = CELLS[calls - 1]
        arguments = {"lang": "python", "code": code, "session": True}
        return Turn(tool_calls=(ToolCall(f"cell_{calls}", "sandbox_exec", arguments),))
    last = json.loads(str(messages[-1]["content"]))
    return Turn(text=f"The best month by revenue, and its total: {last['output'].strip()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, help="spillbox home (default: a temporary one)")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="spillbox-session-"))
    list_orders = UserTool(
        ToolSpec("list_orders", "All orders of the year.", {"type": "object", "properties": {}}),
        lambda _arguments: orders(),
    )
    with Harness(sandbox="docker", home=home) as harness, harness.task("sales") as task:
        result = run(
            task,
            ScriptedModel(script),
            "Which month brought the most revenue?",
            tools=[list_orders],
        )
        for message in result.messages:
            role = message["role"]
            if role == "assistant" and message.get("tool_calls"):
                for call in message["tool_calls"]:
                    print(f"[assistant calls {call['function']['name']}]")
                    arguments = json.loads(call["function"]["arguments"])
                    if "code" in arguments:
                        print(arguments["code"])
            elif role == "tool":
                print(f"[tool result]\n{message['content']}")
            else:
                print(f"[{role}]\n{message.get('content')}")
            print()
        task.close(delete=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
