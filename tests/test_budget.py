"""Budgets per route: real requests in the three provider shapes, counted with real tokens."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from spillbox.budget import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    Budget,
    BudgetExceeded,
    BudgetReport,
    Provider,
    Route,
    ShapeError,
    Stage,
    default_routes,
)
from spillbox.errors import ConfigError
from spillbox.tokens import TiktokenCounter, default_counter

ENC = default_counter()
OVERHEAD = MESSAGE_OVERHEAD_TOKENS
SYSTEM = "You are a careful agent. Answer with evidence."
TASK = "Which step of the nightly build fails, and why?"
RESULT = json.dumps([{"step": i, "status": "ok" if i != 7 else "failed"} for i in range(40)])
TOOL = {
    "type": "function",
    "function": {"name": "logs", "parameters": {"type": "object", "properties": {}}},
}


def tokens(text: str) -> int:
    return ENC.count(text)


def chat_request() -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "logs", "arguments": "{}"}}
    return {
        "model": "gpt-4.1",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASK},
            {"role": "assistant", "content": "Reading logs.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": RESULT},
        ],
        "tools": [TOOL],
    }


def responses_request() -> dict[str, Any]:
    return {
        "model": "gpt-5",
        "instructions": SYSTEM,
        "input": [
            {"role": "user", "content": TASK},
            {"type": "function_call", "call_id": "c1", "name": "logs", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": RESULT},
        ],
        "tools": [{"type": "function", "name": "logs", "parameters": {"type": "object"}}],
    }


def anthropic_request() -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 1024,
        "system": SYSTEM,
        "messages": [
            {"role": "user", "content": TASK},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading logs."},
                    {"type": "tool_use", "id": "c1", "name": "logs", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "c1", "content": RESULT}],
            },
        ],
        "tools": [{"name": "logs", "input_schema": {"type": "object"}}],
    }


REQUESTS: dict[Provider, Callable[[], dict[str, Any]]] = {
    "chat_completions": chat_request,
    "responses": responses_request,
    "anthropic": anthropic_request,
}


@pytest.mark.parametrize("provider", list(REQUESTS))
def test_each_shape_is_counted_by_route_in_real_tokens(provider: Provider) -> None:
    request = REQUESTS[provider]()
    report = Budget(window=100_000).check(request, provider=provider)
    assert report.route("tool_results").used == OVERHEAD + tokens(RESULT)
    system = report.route("system").used
    assert system == tokens(SYSTEM) + (OVERHEAD if provider == "chat_completions" else 0)
    history = report.route("history").used
    assert history >= OVERHEAD + tokens(TASK) and history < OVERHEAD * 4 + tokens(TASK) + 20
    tool_json = json.dumps(request["tools"][0], ensure_ascii=False)
    assert report.route("tools").used == tokens(tool_json)
    assert report.input_tokens == sum(r.used for r in report.routes if r.name != "output")
    assert report.headroom == 100_000 - report.input_tokens - report.reserve_output
    assert report.request is request


def test_the_report_names_use_limit_and_headroom_per_route() -> None:
    report = Budget(window=32_000).check(chat_request(), provider="chat_completions")
    data = report.as_dict()
    assert set(data["routes"]) == {
        "system",
        "tools",
        "history",
        "tool_results",
        "retrieved",
        "output",
    }
    assert data["routes"]["output"] == {"used": 4_800, "soft": 4_800, "limit": 4_800}
    assert data["headroom"] == report.headroom > 0
    assert "tool_results" in str(report) and "headroom" in str(report)


def test_default_routes_fill_the_window_and_soft_limits_are_80_percent() -> None:
    budget = Budget(window=32_000)
    assert sum(r.limit for r in budget.routes.values()) == 32_000
    assert budget.route("history") == Route(9_600, 7_680)
    assert budget.reserve_output == 4_800 and budget.input_limit == 27_200


def test_routes_can_be_renamed_added_and_dropped() -> None:
    budget = Budget(
        window=20_000,
        routes={"instructions": 2_000, "conversation": 12_000, "tools": 1_000},
        reserve_output=4_000,
        kinds={"system": "instructions", "history": "conversation"},
    )
    report = budget.check(chat_request(), provider="chat_completions")
    names = [r.name for r in report.routes]
    assert names == ["instructions", "conversation", "tools", "output"]
    # tool_results and retrieved have no route: they count against history's route
    expected = OVERHEAD + tokens(TASK) + OVERHEAD + tokens("Reading logs.") + tokens("logs{}")
    assert report.route("conversation").used == expected + OVERHEAD + tokens(RESULT)


def test_route_of_marks_retrieved_content() -> None:
    request = chat_request()
    request["messages"].insert(2, {"role": "user", "name": "retrieved", "content": RESULT})
    budget = Budget(
        window=50_000, route_of=lambda m: "retrieved" if m.get("name") == "retrieved" else None
    )
    assert budget.check(request, "chat_completions").route("retrieved").used == OVERHEAD + tokens(
        RESULT
    )


def test_anthropic_documents_count_as_retrieved_and_images_at_a_fixed_cost() -> None:
    request = anthropic_request()
    document = {"type": "document", "source": {"type": "text", "data": RESULT}}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    request["messages"][0]["content"] = [{"type": "text", "text": TASK}, document, image]
    report = Budget(window=50_000).check(request, "anthropic")
    assert report.route("retrieved").used == tokens(json.dumps(document))
    assert report.route("history").used >= IMAGE_TOKENS + tokens(TASK)


def test_over_a_hard_limit_raises_naming_route_use_and_limit() -> None:
    budget = Budget(window=10_000, routes={**default_routes(10_000), "system": 10})
    with pytest.raises(BudgetExceeded) as raised:
        budget.check(chat_request(), provider="chat_completions")
    error = raised.value
    assert (error.route, error.limit) == ("system", 10)
    assert error.used == OVERHEAD + tokens(SYSTEM)
    assert f"{error.used:,} tokens, over its hard limit of 10" in str(error)
    assert "raise routes['system']" in str(error)


class Recorder:
    """A compactor that records what it was asked and drops the tool result's text."""

    def __init__(self) -> None:
        self.calls = 0

    def compact(
        self,
        request: Mapping[str, Any],
        provider: Provider,
        measure: Callable[[Mapping[str, Any]], BudgetReport],
    ) -> tuple[Mapping[str, Any], list[Stage]]:
        self.calls += 1
        before = measure(request).input_tokens
        messages = [dict(m) for m in request["messages"]]
        messages[-1]["content"] = "moved"
        out = {**request, "messages": messages}
        return out, [Stage("test", "moved one", before - measure(out).input_tokens)]


def test_over_a_soft_limit_the_compactor_runs_and_the_report_shows_it() -> None:
    limit = tokens(RESULT) + OVERHEAD
    routes = {**default_routes(50_000), "tool_results": Route(limit, soft=limit // 2)}
    budget = Budget(window=50_000, routes=routes)
    recorder = Recorder()
    request = chat_request()
    report = budget.check(request, "chat_completions", compactor=recorder)
    assert recorder.calls == 1
    assert report.request is not request and request["messages"][-1]["content"] == RESULT
    assert report.route("tool_results").used == OVERHEAD + tokens("moved")
    assert report.stages[0].freed == tokens(RESULT) - tokens("moved")
    assert "test: moved one" in str(report)


def test_under_the_soft_limits_no_compactor_runs() -> None:
    recorder = Recorder()
    Budget(window=50_000).check(chat_request(), "chat_completions", compactor=recorder)
    assert recorder.calls == 0


def test_over_a_hard_limit_after_compaction_still_raises() -> None:
    budget = Budget(window=50_000, routes={**default_routes(50_000), "tool_results": 3})
    with pytest.raises(BudgetExceeded, match="after compaction: test"):
        budget.check(chat_request(), "chat_completions", compactor=Recorder())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window must be a positive number of tokens, got 0"),
        ({"window": -5}, "window must be a positive"),
        ({"window": 1_000, "routes": {"history": 0}}, r"routes\['history'\]: a limit must be"),
        ({"window": 1_000, "routes": {"history": -1}}, r"routes\['history'\]: a limit must be"),
        ({"window": 1_000, "routes": {"history": Route(100, soft=200)}}, "soft limit"),
        ({"window": 1_000, "reserve_output": 0}, "reserve_output must be a positive"),
        (
            {"window": 1_000, "routes": {"history": 900}, "reserve_output": 200},
            "routes: the limits add up to 1,100 tokens, more than the window of 1,000",
        ),
        (
            {"window": 1_000, "routes": {"output": 100}, "reserve_output": 200},
            "reserve_output .200. and routes\\['output'\\] .100. disagree",
        ),
        ({"window": 1_000, "kinds": {"memory": "history"}}, r"kinds\['memory'\]: not a kind"),
        (
            {"window": 1_000, "routes": {"a": 100}, "kinds": {"system": "a"}},
            r"kinds\['tools'\]: no route 'history' to count tools against",
        ),
    ],
)
def test_bad_budgets_name_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Budget(**kwargs)


@pytest.mark.parametrize(
    ("provider", "request_", "message"),
    [
        ("gemini", {"contents": []}, "provider: unknown request shape 'gemini'"),
        ("chat_completions", [], "request: expected a mapping"),
        ("chat_completions", {"input": "hi"}, r"request\['messages'\]: a chat_completions"),
        (
            "chat_completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            r"request\['messages'\]\[0\]\['role'\]: 'robot'",
        ),
        ("responses", {"messages": []}, r"request\['input'\]: a responses request"),
        (
            "responses",
            {"input": [{"type": "tool_result", "content": "x"}]},
            r"request\['input'\]\[0\]\['type'\]: 'tool_result' is not a responses input item",
        ),
        (
            "anthropic",
            {"messages": [{"role": "system", "content": "x"}]},
            r"'system' is not an anthropic role",
        ),
        (
            "anthropic",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            r"request\['messages'\]\[0\]\['content'\]\[0\]\['type'\]: 'image_url'",
        ),
    ],
)
def test_requests_in_an_unknown_shape_name_the_field(
    provider: Any, request_: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Budget(window=10_000).check(request_, provider=provider)


def test_a_chat_request_checked_as_anthropic_is_refused() -> None:
    with pytest.raises(ShapeError, match="not an anthropic role"):
        Budget(window=10_000).check(chat_request(), provider="anthropic")


class CountingCounter:
    """Real tiktoken counts, recording the texts it was asked to count."""

    def __init__(self) -> None:
        self._inner = TiktokenCounter()
        self.name = self._inner.name
        self.max_token_chars = self._inner.max_token_chars
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return self._inner.count(text)


def test_a_check_after_one_new_message_counts_only_that_message() -> None:
    counter = CountingCounter()
    budget = Budget(window=100_000, counter=counter)
    request = chat_request()
    first = budget.check(request, "chat_completions")
    assert RESULT in counter.texts
    counter.texts.clear()
    new = {"role": "user", "content": "Now check step 8 as well."}
    grown = {**request, "messages": [*request["messages"], new]}
    second = budget.check(grown, "chat_completions")
    assert counter.texts == ["Now check step 8 as well."]
    assert second.input_tokens == first.input_tokens + OVERHEAD + tokens(new["content"])


def test_a_message_changed_in_place_is_counted_again() -> None:
    budget = Budget(window=100_000)
    request = chat_request()
    budget.check(request, "chat_completions")
    request["messages"][-1]["content"] = "short"
    assert budget.check(request, "chat_completions").route(
        "tool_results"
    ).used == OVERHEAD + tokens("short")


def test_a_budget_counts_in_its_models_tokens() -> None:
    text = RESULT
    claude = Budget(window=100_000, model="claude-sonnet-4-6")
    request = {"messages": [{"role": "user", "content": text}]}
    used = claude.check(request, "anthropic").route("history").used
    assert used == OVERHEAD + math.ceil(tokens(text) * 1.57)
    gpt = Budget(window=100_000, model="gpt-5.4")
    o200k = default_counter("o200k_base").count(text)
    assert gpt.check(request, "chat_completions").route("history").used == OVERHEAD + o200k


def test_server_tools_and_references_are_counted_where_they_belong() -> None:
    search = {"type": "web_search_tool_result", "tool_use_id": "s1", "content": [{"url": "u"}]}
    use = {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {"q": "x"}}
    request = {
        "messages": [
            {"role": "user", "content": TASK},
            {"role": "assistant", "content": [use, search, {"type": "text", "text": "Found."}]},
        ]
    }
    report = Budget(window=50_000).check(request, "anthropic")
    assert report.route("tool_results").used == tokens(json.dumps(search))
    responses = {
        "input": [{"type": "item_reference", "id": "msg_1"}, {"role": "user", "content": "go"}]
    }
    assert Budget(window=50_000).check(responses, "responses").route("history").used == (
        OVERHEAD + tokens("go")
    )


def test_nothing_before_an_anthropic_compaction_block_is_counted() -> None:
    request = anthropic_request()
    full = Budget(window=100_000).check(request, "anthropic")
    summary = "Read the logs: step 7 failed."
    request["messages"].append(
        {"role": "assistant", "content": [{"type": "compaction", "content": summary}]}
    )
    request["messages"].append({"role": "user", "content": "Go on."})
    report = Budget(window=100_000).check(request, "anthropic")
    assert report.route("tool_results").used == 0  # the result before it is dropped
    assert report.route("system").used == full.route("system").used  # the system prompt stays
    expected = OVERHEAD + tokens(summary) + OVERHEAD + tokens("Go on.")
    assert report.route("history").used == expected
