"""Today's models in the capability table (issue 25 item 6), checked against the SDKs."""

from __future__ import annotations

from typing import Any, get_args

import pytest
from anthropic.types.beta import BetaContextManagementConfigParam
from anthropic.types.beta.beta_context_management_config_param import Edit
from anthropic.types.model_param import ModelParam
from pydantic import TypeAdapter

from spillbox.budget import Budget
from spillbox.native import features, plan_native

NEW_CLAUDE = ("claude-opus-4-8", "claude-sonnet-5", "claude-fable-5", "claude-mythos-5")


def sdk_models() -> set[str]:
    return set(get_args(get_args(ModelParam)[0]))


@pytest.mark.parametrize("model", NEW_CLAUDE)
def test_the_new_claude_models_compact_and_clear_thinking(model: str) -> None:
    assert model in sdk_models()  # a real id, as the installed SDK names it
    assert features("anthropic", model) == {"compaction", "clear_tool_uses", "clear_thinking"}
    budget = Budget(window=200_000)
    summary = plan_native("anthropic", model, budget)
    assert summary.feature == "compaction"
    clear = plan_native("anthropic", model, budget, prefer="clear")
    edits: list[dict[str, Any]] = clear.params["context_management"]["edits"]
    assert [e["type"] for e in edits] == ["clear_thinking_20251015", "clear_tool_uses_20250919"]
    assert edits[0]["keep"] == {"type": "thinking_turns", "value": 1}
    TypeAdapter(BetaContextManagementConfigParam).validate_python(
        clear.params["context_management"]
    )
    for edit in edits:
        TypeAdapter(Edit).validate_python(edit)


def test_older_models_clear_tool_uses_without_the_thinking_edit() -> None:
    plan = plan_native("anthropic", "claude-sonnet-4-6", Budget(window=32_000))
    assert [e["type"] for e in plan.params["context_management"]["edits"]] == [
        "clear_tool_uses_20250919"
    ]


@pytest.mark.parametrize("model", ["gpt-5", "gpt-5-mini", "gpt-5.1", "gpt-5.2", "gpt-5.2-pro"])
def test_openai_models_before_compaction_are_left_out(model: str) -> None:
    # GPT-5.4 is the first model trained for compaction (see the table's comment).
    assert features("responses", model) == frozenset()


@pytest.mark.parametrize("model", ["gpt-5.4", "gpt-5.4-mini", "gpt-5.5", "gpt-5.6-sol", "gpt-6"])
def test_openai_models_from_5_4_compact_on_the_server(model: str) -> None:
    assert features("responses", model) == {"server_compaction", "compact_endpoint"}
