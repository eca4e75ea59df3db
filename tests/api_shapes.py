"""Real-world API responses that wrap their records in an object, built to a size.

The keys are those the services return: GitHub's search API, Slack's
conversations.history, and a GitHub GraphQL connection (nodes, then pageInfo after them,
as a query that asks for them in that order gets them).
"""

from __future__ import annotations

import json
import random
from typing import Any


def github_search(count: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    items = [
        {
            "id": 1_000_000 + i,
            "node_id": f"I_kwDO{i:08d}",
            "number": i + 1,
            "title": f"Parser fails on input {rng.randint(0, 10**6)}",
            "user": {"login": f"dev-{rng.randint(1, 300)}", "id": rng.randint(1, 10**7)},
            "labels": [{"name": name} for name in rng.sample(["bug", "docs", "ci"], k=2)],
            "state": rng.choice(["open", "closed"]),
            "comments": rng.randint(0, 40),
            "html_url": f"https://github.com/acme/widgets/issues/{i + 1}",
            "score": 1.0,
        }
        for i in range(count)
    ]
    return {"total_count": count, "incomplete_results": False, "items": items}


def slack_history(count: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    messages = [
        {
            "type": "message",
            "user": f"U{rng.randint(10**6, 10**7)}",
            "text": f"deploy {rng.randint(0, 999)} finished: {'ok ' * rng.randint(1, 20)}",
            "ts": f"{1_700_000_000 + i}.{rng.randint(0, 999_999):06d}",
            "reactions": [{"name": "tada", "count": rng.randint(1, 5)}],
        }
        for i in range(count)
    ]
    return {
        "ok": True,
        "messages": messages,
        "has_more": True,
        "pin_count": 0,
        "channel_actions_ts": None,
        "channel_actions_count": 0,
        "response_metadata": {"next_cursor": "bmV4dF90czoxNTEyMDg1ODYxMDAwNTQz"},
    }


def graphql_pull_requests(count: int, seed: int = 0) -> dict[str, Any]:
    rng = random.Random(seed)
    nodes = [
        {
            "number": i + 1,
            "title": f"Refactor the cache layer, part {rng.randint(0, 10**6)}",
            "author": {"login": f"dev-{rng.randint(1, 300)}"},
            "createdAt": f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T10:00:00Z",
            "state": rng.choice(["OPEN", "MERGED", "CLOSED"]),
        }
        for i in range(count)
    ]
    connection = {
        "totalCount": count,
        "nodes": nodes,
        "pageInfo": {"hasNextPage": True, "endCursor": "Y3Vyc29yOnYyOpHOAAE="},
    }
    return {"data": {"repository": {"pullRequests": connection}}}


SHAPES = {
    "github_search": (github_search, ("items",), "total_count"),
    "slack_history": (slack_history, ("messages",), "response_metadata"),
    "graphql": (graphql_pull_requests, ("data", "repository", "pullRequests", "nodes"), "data"),
}
"""name: (builder, records path, a key of the envelope)."""


def encoded(value: Any, pretty: bool = False) -> str:
    return json.dumps(value, indent=2 if pretty else None)


def at_least(builder: Any, target_bytes: int, seed: int = 0) -> tuple[str, int]:
    """A payload of the builder's shape over target_bytes (one line), and its record count."""
    probe = len(encoded(builder(200, seed))) / 200
    count = int(target_bytes / probe * 1.02) + 1
    text = encoded(builder(count, seed))
    assert len(text) > target_bytes
    return text, count
