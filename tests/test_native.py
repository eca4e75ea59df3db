"""Native compaction: the capability table, request parameters checked against the openai
and anthropic SDKs' own types, and the offload that runs before the provider removes
anything."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, get_args

import openai
import pytest
from anthropic.types.anthropic_beta_param import AnthropicBetaParam
from anthropic.types.beta import (
    BetaClearToolUses20250919EditParam,
    BetaCompact20260112EditParam,
    BetaContextManagementConfigParam,
    BetaInputTokensTriggerParam,
    BetaToolUsesKeepParam,
)
from anthropic.types.beta.beta_context_management_config_param import Edit
from anthropic.types.beta.message_create_params import MessageCreateParamsNonStreaming
from openai.types.responses.response_compact_params import ResponseCompactParams
from openai.types.responses.response_create_params import (
    ContextManagement,
    ResponseCreateParamsNonStreaming,
)
from pydantic import TypeAdapter, ValidationError

from spillbox import Harness, Task
from spillbox.budget import Budget, Route, default_routes
from spillbox.errors import ConfigError
from spillbox.native import (
    ANTHROPIC_COMPACTION_BETA,
    ANTHROPIC_CONTEXT_EDITING_BETA,
    DEFAULT_CAPABILITIES,
    Capability,
    Native,
    compact_params,
    compact_responses,
    features,
    plan_native,
)
from spillbox.tools import Toolset


def conforms(typed_dict: Any, value: Any) -> None:
    """value validates as the SDK's TypedDict and holds no key it does not declare.

    pydantic validates an Iterable field's items lazily (and pydantic-core 2.50 panics
    consuming some of them), so the tests validate those items on their own, as lists.
    """
    TypeAdapter(typed_dict).validate_python(value)
    keys = typed_dict.__required_keys__ | typed_dict.__optional_keys__
    assert set(value) <= keys, set(value) - keys


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("native") as task:
            task.register_tools(Toolset(task).names)
            yield task


def test_the_capability_table() -> None:
    assert features("responses", "gpt-5.4") == {"server_compaction", "compact_endpoint"}
    assert features("anthropic", "claude-sonnet-4-6") == {"compaction", "clear_tool_uses"}
    assert features("anthropic", "claude-sonnet-4-5-20250929") == {"clear_tool_uses"}
    assert features("anthropic", "claude-3-5-haiku-latest") == frozenset()
    assert features("chat_completions", "gpt-5.4") == frozenset()
    assert features("responses", "gpt-4.1") == frozenset()


def test_the_user_can_override_the_table() -> None:
    mine = (Capability("responses", "gpt-4.1*", frozenset({"server_compaction"})),)
    assert features("responses", "gpt-4.1-mini", mine + DEFAULT_CAPABILITIES) == {
        "server_compaction"
    }
    none = (Capability("anthropic", "claude-sonnet-4-6*", frozenset()),)
    assert features("anthropic", "claude-sonnet-4-6", none + DEFAULT_CAPABILITIES) == frozenset()


def test_responses_compaction_params_validate_against_the_openai_sdk() -> None:
    budget = Budget(window=400_000)
    plan = plan_native("responses", "gpt-5.4", budget, store=False)
    assert plan.feature == "server_compaction"
    assert plan.threshold == budget.compact_threshold() == int(340_000 * 0.8)
    assert plan.params == {
        "context_management": [{"type": "compaction", "compact_threshold": 272_000}],
        "store": False,
    }
    body = {"model": "gpt-5.4", "input": [{"role": "user", "content": "hi"}], **plan.params}
    conforms(ResponseCreateParamsNonStreaming, body)
    TypeAdapter(list[ContextManagement]).validate_python(plan.params["context_management"])
    for entry in plan.params["context_management"]:
        conforms(ContextManagement, entry)
    # store=False is the default (issue 25 item 5): the loop never chains responses.
    assert plan_native("responses", "gpt-5.4", budget).params["store"] is False
    assert plan_native("responses", "gpt-5.4", budget, store=True).params["store"] is True


def test_the_compact_endpoint_params_validate_against_the_openai_sdk() -> None:
    items = [
        {"role": "user", "content": "Find the failing step."},
        {"type": "function_call", "call_id": "c1", "name": "logs", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "step 7 failed"},
    ]
    conforms(ResponseCompactParams, compact_params("gpt-5.4", items, "Be careful."))


def test_anthropic_compaction_params_validate_against_the_anthropic_sdk() -> None:
    budget = Budget(window=200_000)
    plan = plan_native("anthropic", "claude-sonnet-4-6", budget)
    assert plan.feature == "compaction" and plan.betas == (ANTHROPIC_COMPACTION_BETA,)
    edit = plan.params["context_management"]["edits"][0]
    assert edit == {
        "type": "compact_20260112",
        "trigger": {"type": "input_tokens", "value": budget.compact_threshold()},
    }
    _conforms_anthropic(plan.params, list(plan.betas))
    conforms(BetaCompact20260112EditParam, edit)
    conforms(BetaInputTokensTriggerParam, edit["trigger"])


def test_anthropic_clearing_params_validate_against_the_anthropic_sdk() -> None:
    budget = Budget(window=200_000)
    plan = plan_native("anthropic", "claude-opus-4-6", budget, prefer="clear", keep_tool_uses=2)
    assert plan.feature == "clear_tool_uses" and plan.betas == (ANTHROPIC_CONTEXT_EDITING_BETA,)
    edit = plan.params["context_management"]["edits"][0]
    assert edit["type"] == "clear_tool_uses_20250919"
    assert edit["keep"] == {"type": "tool_uses", "value": 2}
    _conforms_anthropic(plan.params, list(plan.betas))
    conforms(BetaClearToolUses20250919EditParam, edit)
    conforms(BetaToolUsesKeepParam, edit["keep"])


def _conforms_anthropic(params: dict[str, Any], betas: list[str]) -> None:
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "hi"}],
        "betas": betas,
        **params,
    }
    conforms(MessageCreateParamsNonStreaming, body)
    conforms(BetaContextManagementConfigParam, params["context_management"])
    TypeAdapter(list[Edit]).validate_python(params["context_management"]["edits"])
    known = {v for arg in get_args(AnthropicBetaParam) for v in get_args(arg)}
    assert set(betas) <= known


def test_a_window_too_small_for_anthropic_compaction_clears_tool_uses_instead() -> None:
    plan = plan_native("anthropic", "claude-sonnet-4-6", Budget(window=32_000))
    assert plan.threshold < 50_000
    assert plan.feature == "clear_tool_uses"
    only_compaction = (Capability("anthropic", "claude-x*", frozenset({"compaction"})),)
    fallback = plan_native(
        "anthropic", "claude-x-1", Budget(window=32_000), capabilities=only_compaction
    )
    assert fallback.feature is None and "at least 50,000" in fallback.reason


def test_models_without_native_compaction_get_the_fallback() -> None:
    plan = plan_native("chat_completions", "gpt-5.4", Budget(window=32_000))
    assert plan.feature is None and plan.params == {} and plan.reason.startswith("fallback")


def test_bad_plan_options_name_the_field() -> None:
    with pytest.raises(ConfigError, match="prefer must be"):
        plan_native("anthropic", "claude-sonnet-4-6", Budget(window=200_000), prefer="drop")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="keep_tool_uses must be"):
        plan_native("anthropic", "claude-sonnet-4-6", Budget(window=200_000), keep_tool_uses=-1)


def _anthropic_session(steps: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing step."}]
    for i in range(steps):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"t{i}", "name": "logs", "input": {"step": i}}
                ],
            }
        )
        text = "".join(f"step {i} line {n}: ok\n" for n in range(80))
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": text}],
            }
        )
    return {"system": "You are careful.", "messages": messages}


def _tight_budget(window: int = 200_000) -> Budget:
    routes = {**default_routes(window), "tool_results": Route(20_000, soft=2_000)}
    return Budget(window=window, routes=routes)


@pytest.mark.parametrize(("prefer", "stored"), [("summary", 8), ("clear", 5)])
def test_tool_results_are_stored_before_the_provider_removes_them(
    task: Task, prefer: Any, stored: int
) -> None:
    budget = _tight_budget()
    plan = plan_native("anthropic", "claude-sonnet-4-6", budget, prefer=prefer)
    request = {**_anthropic_session(8), **plan.params}
    native = Native(task, plan)
    report = budget.check(request, "anthropic", compactor=native)
    assert report.request is request  # the provider compacts; spillbox leaves it as it is
    assert [s.name for s in report.stages] == ["native"]
    assert f"{stored} tool results stored first" in report.stages[0].detail
    rows = {a.call_id: a for a in task.artifacts()}
    for i in range(stored):
        block = request["messages"][2 + 2 * i]["content"][0]
        assert task.read(rows[f"t{i}"]).decode() == block["content"]
    again = budget.check(request, "anthropic", compactor=native)
    assert "0 tool results stored first" in again.stages[0].detail
    assert len(task.artifacts()) == stored


def test_a_request_over_a_hard_limit_falls_back_after_storing(task: Task) -> None:
    routes = {**default_routes(200_000), "tool_results": Route(3_000, soft=2_000)}
    budget = Budget(window=200_000, routes=routes)
    plan = plan_native("anthropic", "claude-sonnet-4-6", budget)
    report = budget.check(_anthropic_session(8), "anthropic", compactor=Native(task, plan))
    assert [s.name for s in report.stages][:2] == ["native", "tool_results"]
    assert not report.over_hard


class _CompactServer(BaseHTTPRequestHandler):
    """A local stand-in for POST /v1/responses/compact: records the body, answers as the
    API's reference shows (the user messages, then one compaction item)."""

    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append({"path": self.path, **body})
        users = [i for i in body["input"] if i.get("role") == "user"]
        output = [
            {
                "type": "message",
                "id": f"msg_{n}",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_text", "text": u["content"]}],
            }
            for n, u in enumerate(users)
        ]
        output.append({"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"})
        reply = {
            "id": "resp_1",
            "object": "response.compaction",
            "created_at": 1,
            "output": output,
            "usage": {
                "input_tokens": 10,
                "output_tokens": 5,
                "total_tokens": 15,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_explicit_compaction_through_the_openai_sdk_stores_tool_results_first(task: Task) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CompactServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = openai.OpenAI(
            api_key="test", base_url=f"http://127.0.0.1:{server.server_port}/v1", max_retries=0
        )
        output = "".join(f"row {n}: ok\n" for n in range(300))
        items = [
            {"role": "user", "content": "Find the failing step."},
            {"type": "function_call", "call_id": "c1", "name": "logs", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": output},
        ]
        compacted = compact_responses(task, client, "gpt-5.4", items)
        client.close()
    finally:
        server.shutdown()
        server.server_close()
    [body] = _CompactServer.bodies
    assert body["path"] == "/v1/responses/compact"
    assert body["model"] == "gpt-5.4" and body["input"] == items
    assert [i["type"] for i in compacted] == ["message", "compaction"]
    [row] = task.artifacts()
    assert row.call_id == "c1" and row.tool == "logs" and task.read(row).decode() == output


def test_the_sdk_check_refuses_a_wrong_parameter() -> None:
    with pytest.raises(ValidationError):
        conforms(BetaInputTokensTriggerParam, {"type": "tokens", "value": 50_000})
    with pytest.raises(AssertionError):
        conforms(BetaCompact20260112EditParam, {"type": "compact_20260112", "threshold": 1})
    with pytest.raises(ValidationError):
        TypeAdapter(list[ContextManagement]).validate_python([{"compact_threshold": 5}])


def test_tool_results_are_stored_at_the_threshold_even_with_every_route_under_soft(
    task: Task,
) -> None:
    routes = {
        "system": 1_000,
        "tools": 1_000,
        "history": Route(40_000, soft=39_000),
        "tool_results": Route(40_000, soft=39_000),
    }
    budget = Budget(window=100_000, routes=routes, reserve_output=18_000)
    plan = plan_native("responses", "gpt-5.4", budget)
    assert plan.threshold == 65_600
    output = "".join(f"row {n}: ok\n" for n in range(2_450))  # about 17k tokens
    items: list[dict[str, Any]] = [{"role": "user", "content": "go " * 34_000}]
    for i in range(2):
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "q", "arguments": "{}"})
        items.append(
            {"type": "function_call_output", "call_id": f"c{i}", "output": output + str(i)}
        )
    request = {"input": items, **plan.params}
    report = budget.check(request, "responses", compactor=Native(task, plan))
    assert not report.needs_room and report.input_tokens >= plan.threshold
    assert [s.name for s in report.stages] == ["native"]
    assert sorted(a.call_id for a in task.artifacts()) == ["c0", "c1"]
