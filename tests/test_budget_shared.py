"""A budget that lets the model use its window (issue 25 item 8) and knows known models'
windows (item 5)."""

from __future__ import annotations

from typing import Any

import pytest

from spillbox.budget import (
    DEFAULT_SOFT_SHARE,
    Budget,
    BudgetExceeded,
    Route,
    default_routes,
)
from spillbox.errors import ConfigError
from spillbox.tokens import default_counter

WINDOW = 32_000
INPUT_LIMIT = WINDOW - int(WINDOW * 0.15)  # 27,200


def request(tool_tokens: int, history_tokens: int = 50) -> dict[str, Any]:
    """A chat request of about that many tokens of tool results and of history."""
    counter = default_counter()
    unit = "alpha beta gamma delta "
    per = counter.count(unit * 1000) / 1000  # repeated, as the contents are
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": unit * int(history_tokens / per)},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "logs", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": unit * int(tool_tokens / per)},
    ]  # fmt: skip
    return {"messages": messages}


def test_tool_results_may_take_the_room_history_leaves() -> None:
    budget = Budget(window=WINDOW)
    # 75% of what the window leaves, nearly all tool results: far past the old 30% route,
    # yet nothing to compact and nothing over a limit.
    report = budget.check(request(int(INPUT_LIMIT * 0.75)), "chat_completions")
    assert report.input_tokens >= 0.7 * INPUT_LIMIT
    assert not report.needs_room and not report.over_hard
    assert report.room("tool_results") == report.headroom


def test_compaction_starts_at_the_soft_share_of_the_input_limit() -> None:
    budget = Budget(window=WINDOW)
    asked: list[int] = []

    class Recorder:
        def compact(self, req: Any, provider: Any, measure: Any) -> tuple[Any, list[Any]]:
            asked.append(measure(req).input_tokens)
            return req, []

    below = request(int(INPUT_LIMIT * DEFAULT_SOFT_SHARE) - 200)
    above = request(int(INPUT_LIMIT * DEFAULT_SOFT_SHARE) + 200)
    budget.check(below, "chat_completions", Recorder())
    assert asked == []
    budget.check(above, "chat_completions", Recorder())
    assert len(asked) == 1 and asked[0] > budget.compact_threshold()


def test_past_the_input_limit_the_check_still_fails_loudly() -> None:
    budget = Budget(window=WINDOW)
    with pytest.raises(BudgetExceeded) as raised:
        budget.check(request(INPUT_LIMIT + 500, history_tokens=400), "chat_completions")
    error = raised.value
    assert error.route == "tool_results"  # the largest of the routes that share the room
    assert error.limit < error.used
    assert "the conversation fills what the window leaves" in str(error)
    assert "pass a compactor" in str(error)


def test_the_system_and_tools_routes_keep_their_own_limits() -> None:
    budget = Budget(window=WINDOW)
    big_system = {"messages": [{"role": "system", "content": "rule " * 4_000}]}
    with pytest.raises(BudgetExceeded) as raised:
        budget.check(big_system, "chat_completions")
    assert raised.value.route == "system" and raised.value.limit == int(WINDOW * 0.10)


@pytest.mark.parametrize(
    "budget",
    [
        Budget(window=WINDOW, routes=default_routes(WINDOW)),
        Budget(window=WINDOW, share_room=False),
    ],
)
def test_routes_of_their_own_keep_each_route_to_its_share(budget: Budget) -> None:
    report = budget.measure(request(int(WINDOW * 0.28)), "chat_completions")
    assert report.needs_room  # past 80% of the 30% route
    with pytest.raises(BudgetExceeded, match="raise routes\\['tool_results'\\]"):
        budget.check(request(int(WINDOW * 0.35)), "chat_completions")


def test_a_shared_budget_can_be_asked_for_with_custom_routes() -> None:
    routes = {**default_routes(WINDOW), "history": Route(5_000)}
    budget = Budget(window=WINDOW, routes=routes, share_room=True)
    report = budget.check(request(int(INPUT_LIMIT * 0.7)), "chat_completions")
    assert not report.needs_room


def test_excess_counts_the_shared_room_once() -> None:
    budget = Budget(window=WINDOW)
    report = budget.measure(request(int(INPUT_LIMIT * 0.9)), "chat_completions")
    pool = sum(r.used for r in report.routes if r.name in report.shared)
    rest = report.input_tokens - pool
    assert report.excess(0.6) == pool - int((INPUT_LIMIT - rest) * 0.6)


def test_a_known_model_brings_its_window_and_the_callers_figure_wins() -> None:
    assert Budget(model="claude-fable-5").window == 1_000_000
    assert Budget(model="claude-haiku-4-5-20251001").window == 200_000
    assert Budget(model="gpt-5.4-mini").window == 1_000_000
    assert Budget(window=50_000, model="claude-fable-5").window == 50_000
    with pytest.raises(ConfigError, match="does not know the window of 'my-model'"):
        Budget(model="my-model")
    with pytest.raises(ConfigError, match="give the model's window"):
        Budget()
