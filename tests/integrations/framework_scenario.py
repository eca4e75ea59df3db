"""The scenario every framework integration's test runs (issue 26 item 4), in one place.

One model turn calls three tools in parallel whose results are about 4.5k, 5.6k and 8k tokens
(tiktoken cl100k): together 18k, over the step's 10,000-token aggregate. The 8k result is
offloaded for itself (over the 6,000-token per-call limit); then the largest of the rest
(5.6k) until the step fits (4.5k + 5.6k is just over 10k). The model reads the offloaded
orders back with read_artifact and asks sandbox_exec for the sum of the open orders'
amounts, which must equal OPEN_TOTAL. A fourth tool returns a short config holding SECRET
(must never reach the model under a redacting policy), a fifth a small result that must
pass untouched.

Each framework's test scripts its fake model with these pieces: TOOLS (name -> the exact text
the tool returns), the names of the three parallel calls, how to find the offloaded results'
notices, and the SQL the model asks once it has read a notice.
"""

from __future__ import annotations

import json
import re

from spillbox import parse_notice
from spillbox.tokens import default_counter


def _records(kind: str, n: int, body: int) -> str:
    rows = [
        {
            "id": i,
            "kind": kind,
            "status": "open" if i % 3 else "closed",
            "amount": (i * 37) % 1000,
            "body": f"{kind} {i} " + "lorem ipsum dolor sit amet " * body,
        }
        for i in range(n)
    ]
    return json.dumps(rows, indent=1)


ORDERS = _records("order", 90, 10)
"""About 8k tokens: offloaded for itself."""
USERS = _records("user", 63, 10)
"""About 5.6k tokens: offloaded by the aggregate rule (the largest left over the step's 10k)."""
EVENTS = _records("event", 50, 10)
"""About 4.5k tokens: stays inline (with the users' 5.6k it would pass 10k)."""

OPEN_TOTAL = sum(row["amount"] for row in json.loads(ORDERS) if row["status"] == "open")
"""The answer the model must give: the sum of the open orders' amounts."""

SECRET = "AKIAIOSFODNN7REALKEY"
CONFIG = json.dumps({"region": "eu-west-1", "aws_access_key_id": SECRET})
SMALL = '{"ok": true, "count": 3}'

TOOLS: dict[str, str] = {
    "list_orders": ORDERS,
    "list_users": USERS,
    "list_events": EVENTS,
    "get_config": CONFIG,
    "ping": SMALL,
}
PARALLEL = ("list_orders", "list_users", "list_events")
"""The three calls of the one step."""


def tokens(text: str) -> int:
    return default_counter().count(text)


def notice_of(text: str) -> dict[str, str] | None:
    """The fields of a spillbox notice inside a tool result the model received, or None."""
    start = text.find("[spillbox offloaded")
    if start < 0:
        return None
    end = text.find("[/spillbox]", start)
    return parse_notice(text[start : end + len("[/spillbox]")]) if end > 0 else None


def open_total_sql(notice: dict[str, str]) -> str:
    """The SQL the model runs once it has read the orders' notice: its table, as the notice's
    own SQL hint names it."""
    for line in notice.get("hint", "").splitlines():
        name, _, raw = line.partition(" ")
        if not name.endswith("sandbox_exec"):
            continue
        arguments = json.loads(raw)
        found = re.search(r"\bFROM\s+(\S+)", arguments.get("code", ""))
        if arguments.get("lang") == "sql" and found:
            return f"SELECT sum(amount) AS total FROM {found.group(1)} WHERE status = 'open'"
    raise AssertionError(f"the notice has no SQL hint: {notice}")


def check_sizes() -> None:
    """The payloads are the sizes the scenario says (guards the scenario, not spillbox)."""
    assert 7_000 < tokens(ORDERS) < 9_000, tokens(ORDERS)
    assert 5_000 < tokens(USERS) < 6_000, tokens(USERS)
    assert 4_000 < tokens(EVENTS) < 5_000, tokens(EVENTS)
    assert tokens(USERS) + tokens(EVENTS) > 10_000
