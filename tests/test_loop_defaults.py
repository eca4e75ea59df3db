"""Compaction and budgets wired by default (issue 25 item 5)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from spillbox import Harness, Task
from spillbox.budget import Budget, BudgetExceeded
from spillbox.compaction import Fallback
from spillbox.config import ModelEndpoint
from spillbox.loop import (
    AnthropicModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ScriptedModel,
    ToolCall,
    Turn,
    UserTool,
    _default_compactor,
    model_from_endpoint,
    run,
)
from spillbox.native import Native, plan_native
from spillbox.tools import ToolSpec
from test_loop import FakeServer, responses_reply, server  # noqa: F401 - server: a fixture

LOGS = ToolSpec("logs", "A build log.", {"type": "object", "properties": {}, "required": []})


def log_tool(arguments: Mapping[str, Any]) -> str:
    return "".join(f"unit {n}: compiled in {n * 7 % 900} ms\n" for n in range(300))


def reader(steps: int) -> ScriptedModel:
    asked = iter(range(steps))

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        step = next(asked, None)
        return Turn("done") if step is None else Turn("", (ToolCall(f"c{step}", "logs", {}),))

    return ScriptedModel(script)


class Planned(ScriptedModel):
    """A scripted model carrying a NativePlan, as OpenAIResponsesModel and AnthropicModel do."""

    def __init__(self, steps: int, native: Any) -> None:
        super().__init__(reader(steps)._script)
        self.native = native


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("defaults") as task:
            yield task


def test_a_budget_without_a_compactor_compacts_with_the_fallback(task: Task) -> None:
    budget = Budget(window=16_000)
    result = run(task, reader(20), "go", [UserTool(LOGS, log_tool)], max_steps=25, budget=budget)
    assert result.answer == "done"
    stages = {s.name for r in result.reports for s in r.stages}
    assert "tool_results" in stages


def test_compactor_none_turns_compaction_off_and_the_budget_fails_loudly(task: Task) -> None:
    with pytest.raises(BudgetExceeded):
        run(task, reader(20), "go", [UserTool(LOGS, log_tool)], max_steps=25,
            budget=Budget(window=16_000), compactor=None)  # fmt: skip


def test_a_model_with_a_native_plan_gets_native_by_default(task: Task) -> None:
    budget = Budget(window=200_000)
    model = Planned(2, plan_native("anthropic", "claude-sonnet-4-6", budget))
    assert isinstance(_default_compactor(task, model), Native)
    assert isinstance(_default_compactor(task, reader(1)), Fallback)
    # At the provider's threshold Native stores the results it would remove, and says so.
    small = Budget(window=16_000)
    planned = Planned(8, plan_native("anthropic", "claude-sonnet-4-6", small))
    result = run(task, planned, "go", [UserTool(LOGS, log_tool)], budget=small)
    assert result.answer == "done"
    assert "native" in {s.name for r in result.reports for s in r.stages}


def endpoint(provider: str, model: str, url: str = "http://127.0.0.1:9") -> ModelEndpoint:
    return ModelEndpoint(provider, url, "sk-test", model)  # type: ignore[arg-type]


def test_model_from_endpoint_uses_the_providers_compaction_where_the_model_has_it() -> None:
    responses = model_from_endpoint(endpoint("openai", "gpt-5.4"))
    assert isinstance(responses, OpenAIResponsesModel) and responses.native is not None
    assert responses.native.feature == "server_compaction"
    assert responses.native.threshold == Budget(model="gpt-5.4").compact_threshold()
    assert isinstance(model_from_endpoint(endpoint("openai", "gpt-4.1")), OpenAIChatModel)
    assert isinstance(model_from_endpoint(endpoint("openai", "gpt-5.2")), OpenAIChatModel)
    claude = model_from_endpoint(endpoint("anthropic", "claude-sonnet-4-6"))
    assert isinstance(claude, AnthropicModel) and claude.native is not None
    assert claude.native.feature == "compaction"
    # A model the table does not know: no native parameters, nothing guessed.
    other = model_from_endpoint(endpoint("anthropic", "claude-test"))
    assert isinstance(other, AnthropicModel) and other.native is None
    # The caller's budget sets the threshold.
    small = model_from_endpoint(endpoint("openai", "gpt-6"), budget=Budget(window=64_000))
    assert isinstance(small, OpenAIResponsesModel) and small.native is not None
    assert small.native.threshold == Budget(window=64_000).compact_threshold()


def test_responses_requests_keep_nothing_at_openai_by_default(
    server: FakeServer,  # noqa: F811 - the fixture imported above
    task: Task,
) -> None:
    answer = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "done", "annotations": []}],
    }
    server.replies += [(200, responses_reply([answer]))] * 2
    plain = OpenAIResponsesModel(endpoint("openai", "test-model", server.url + "/v1"))
    assert run(task, plain, "go").answer == "done"
    wired = model_from_endpoint(endpoint("openai", "gpt-5.4", server.url + "/v1"))
    assert run(task, wired, "go").answer == "done"
    first, second = (request["body"] for request in server.requests)
    assert first["store"] is False and "context_management" not in first
    assert second["store"] is False and second["context_management"][0]["type"] == "compaction"
