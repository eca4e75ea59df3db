"""A multi-step analysis in the task's persistent Python session: a sales API returns 5,000
orders (offloaded); the model loads them into a pyarrow table once, then, call after call,
reuses that table (and a helper it defined) without loading it again, and last draws a
chart of it with matplotlib, which comes back to the model as an image.

Run with `python examples/session_analysis.py [--home DIR]` (needs Docker; builds the sandbox
image if it is missing). It prints the conversation as the model saw it: the notice, each
sandbox_exec call with session true, and what came back; the chart as a line naming it (its
artifact's path, type and size), where the model got the image itself. The model is
scripted (no key).
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spillbox import Harness
from spillbox.loop import IMAGE_PATH, ScriptedModel, ToolCall, Turn, UserTool, run
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
    # Step 4: a chart of the same table; a figure left open comes back as an image.
    "import matplotlib.pyplot as plt\n"
    "months = sorted(by('month'))\n"
    "plt.bar([m[5:] for m, _ in months], [total for _, total in months])\n"
    "plt.title('Revenue by month, 2026')\n"
    "plt.xlabel('month')\n"
    "plt.tight_layout()",
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
    best = next(m for m in messages if m.get("tool_call_id") == f"cell_{len(CELLS) - 1}")
    answer = json.loads(text_of(best))["output"].strip()
    return Turn(text=f"The best month by revenue, and its total: {answer} (chart above)")


def text_of(message: Mapping[str, Any]) -> str:
    """A tool message's text: its content, or the text part before its images."""
    content = message["content"]
    return content if isinstance(content, str) else str(content[0]["text"])


def image_lines(message: Mapping[str, Any]) -> list[str]:
    """One line for each image a tool message carries (the model gets the image itself)."""
    content = message["content"]
    parts = [] if isinstance(content, str) else content
    lines = []
    for part in parts:
        if part.get("type") == "image_url":
            header, _, data = part["image_url"]["url"].partition(",")
            mime = header.removeprefix("data:").removesuffix(";base64")
            size = len(base64.b64decode(data))
            lines.append(f"[image: {part[IMAGE_PATH]}, {mime}, {size:,} bytes]")
    return lines


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
                print("\n".join([f"[tool result]\n{text_of(message)}", *image_lines(message)]))
            else:
                print(f"[{role}]\n{message.get('content')}")
            print()
        task.close(delete=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
