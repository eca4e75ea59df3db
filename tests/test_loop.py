"""The agent loop: a scripted model end to end, and the real-endpoint model classes against
a fake HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import ResponseInputParam
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import TypeAdapter

import spillbox.loop
from spillbox import ConfigError, Harness, Settings, SpillboxError, Task, parse_notice
from spillbox.budget import Budget, BudgetExceeded, default_routes
from spillbox.compaction import Fallback
from spillbox.config import ModelEndpoint, Policy
from spillbox.loop import (
    AnthropicModel,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ScriptedModel,
    ToolCall,
    Turn,
    UserTool,
    model_from_endpoint,
    run,
    to_anthropic,
)
from spillbox.native import ANTHROPIC_COMPACTION_BETA, Native, plan_native
from spillbox.tools import Toolset, ToolSpec

PRS = [
    {"id": i, "title": f"PR {i}", "author": f"dev{i % 7}", "body": "long body text " * 80}
    for i in range(150)
]
LIST_PRS = ToolSpec(
    "list_prs",
    "List the repository's pull requests.",
    {
        "type": "object",
        "properties": {"state": {"type": "string"}},
        "additionalProperties": False,
    },
)


def list_prs(arguments: Mapping[str, Any]) -> str:
    return json.dumps(PRS)


@pytest.fixture
def task(home: Path) -> Iterator[Task]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("loop") as task:
            yield task


def tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [m for m in messages if m["role"] == "tool"]


# A scripted model end to end


def read_back_script(messages: Sequence[Mapping[str, Any]]) -> Turn:
    """List PRs; open the offloaded result with read_artifact; answer from the page."""
    results = tool_messages(messages)
    if not results:
        return Turn("Listing PRs.", (ToolCall("call_1", "list_prs", {"state": "all"}),))
    if len(results) == 1:
        fields = parse_notice(str(results[0]["content"]))
        assert fields is not None, "the big result should have come back as a notice"
        return Turn("", (ToolCall("call_2", "read_artifact", {"path": fields["path"]}),))
    page = json.loads(str(results[1]["content"]))
    return Turn(f"The first PR is {page['items'][0]['title']} by {page['items'][0]['author']}.")


def test_a_scripted_run_offloads_reads_back_and_answers(task: Task) -> None:
    result = run(
        task,
        ScriptedModel(read_back_script),
        "Who wrote the first PR?",
        tools=[UserTool(LIST_PRS, list_prs)],
        system="Be brief.",
    )
    assert result.answer == "The first PR is PR 0 by dev0."
    messages = result.messages
    assert [m["role"] for m in messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1] == {"role": "user", "content": "Who wrote the first PR?"}
    assert messages[2]["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "list_prs", "arguments": json.dumps({"state": "all"})},
        }
    ]
    assert messages[3]["tool_call_id"] == "call_1"
    notice = parse_notice(messages[3]["content"])
    assert notice is not None and notice["tool"] == "list_prs"
    assert notice["hint"].startswith("read_artifact ")  # the loop registered the tools
    assert messages[5]["tool_call_id"] == "call_2"
    assert json.loads(messages[5]["content"])["items"][0] == PRS[0]
    assert messages[6] == {"role": "assistant", "content": result.answer}

    first, second = result.steps
    assert [c.name for c in first.calls] == ["list_prs"] and first.admitted[0].offloaded
    assert [c.name for c in second.calls] == ["read_artifact"]
    assert not second.admitted[0].offloaded  # a page is never offloaded again
    assert task.read("call_1") == json.dumps(PRS).encode()
    assert 0 < result.context_tokens < result.inline_tokens
    payload_tokens = first.admitted[0].tokens
    assert payload_tokens is not None
    assert result.inline_tokens - result.context_tokens > payload_tokens // 2
    assert result.seconds >= 0


def test_unknown_and_failing_tools_come_back_as_errors(task: Task) -> None:
    def flaky(arguments: Mapping[str, Any]) -> str:
        raise RuntimeError("the upstream API is down")

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        if not tool_messages(messages):
            calls = (
                ToolCall("a", "no_such_tool", {}),
                ToolCall("b", "flaky", {}),
                ToolCall("c", "list_artifacts", {}),
                ToolCall("d", "read_artifact", {"artifact_id": "missing"}),
            )
            return Turn("Trying.", calls)
        return Turn("Nothing worked.")

    flaky_tool = UserTool(ToolSpec("flaky", "Fails.", {"type": "object", "properties": {}}), flaky)
    result = run(task, ScriptedModel(script), "go", tools=[flaky_tool])
    assert result.answer == "Nothing worked."
    [step] = result.steps
    assert [a.is_error for a in step.admitted] == [True, True, False, True]
    by_id = {m["tool_call_id"]: m["content"] for m in tool_messages(result.messages)}
    assert json.loads(by_id["a"]) == {"error": "unknown tool 'no_such_tool'"}
    assert json.loads(by_id["b"]) == {"error": "RuntimeError: the upstream API is down"}
    assert json.loads(by_id["c"]) == []
    assert "no artifact 'missing'" in json.loads(by_id["d"])["error"]


def test_binary_results_parallel_calls_and_the_step_limit(task: Task) -> None:
    image = UserTool(
        ToolSpec("screenshot", "A PNG.", {"type": "object", "properties": {}}),
        lambda arguments: b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40,
    )

    def forever(messages: Sequence[Mapping[str, Any]]) -> Turn:
        n = len(tool_messages(messages))
        return Turn("", (ToolCall(f"s{n}", "screenshot", {}), ToolCall(f"p{n}", "list_prs", {})))

    result = run(
        task,
        ScriptedModel(forever),
        "loop",
        tools=[image, UserTool(LIST_PRS, list_prs)],
        max_steps=3,
    )
    assert result.answer == "" and len(result.steps) == 3
    for step in result.steps:
        assert [a.reason for a in step.admitted] == ["binary", "per_call"]


def test_user_tools_may_not_take_spillbox_names(task: Task) -> None:
    clash = UserTool(ToolSpec("read_artifact", "Mine.", {"type": "object"}), list_prs)
    with pytest.raises(ConfigError, match="read_artifact"):
        run(task, ScriptedModel(lambda messages: Turn("x")), "go", tools=[clash])


# Real endpoints, against a fake HTTP server


class FakeServer:
    """Records each request and answers from a queue of (status, JSON-able or bytes)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[tuple[int, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a stuck client cannot hold the server

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                outer.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": json.loads(self.rfile.read(length)),
                    }
                )
                status, reply = outer.replies.pop(0)
                data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))

    def endpoint(self, provider: str, path: str = "") -> ModelEndpoint:
        return ModelEndpoint(provider, self.url + path, "sk-test-key", "test-model")  # type: ignore[arg-type]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeServer]:
    monkeypatch.setattr(spillbox.loop, "HTTP_TIMEOUT_SECONDS", 10.0)
    fake = FakeServer()
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        fake.thread.join(timeout=10)
        assert not fake.thread.is_alive()


HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Who merged most?"},
    {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "list_prs", "arguments": "{}"}},
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "list_artifacts", "arguments": ""},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "[spillbox offloaded v1]\n...\n[/spillbox]"},
    {"role": "tool", "tool_call_id": "c2", "content": "[]"},
]


def specs(task: Task) -> list[ToolSpec]:
    return [LIST_PRS, *Toolset(task).specs()]


def test_openai_chat_model_sends_the_history_and_parses_tool_calls(
    server: FakeServer, task: Task
) -> None:
    server.replies.append(
        (
            200,
            {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "c3",
                                    "type": "function",
                                    "function": {
                                        "name": "read_artifact",
                                        "arguments": '{"artifact_id": "c1"}',
                                    },
                                }
                            ],
                        }
                    }
                ]
            },
        )
    )
    model = OpenAIChatModel(server.endpoint("openai", "/v1/"))
    turn = model.respond(HISTORY, specs(task))
    assert turn == Turn("", (ToolCall("c3", "read_artifact", {"artifact_id": "c1"}),))
    [request] = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer sk-test-key"
    assert request["headers"]["content-type"] == "application/json"
    body = request["body"]
    assert body["model"] == "test-model"
    assert body["messages"] == HISTORY
    assert body["tools"] == [spec.definition("openai") for spec in specs(task)]


def test_anthropic_model_sends_system_apart_and_tool_blocks(server: FakeServer, task: Task) -> None:
    server.replies.append(
        (
            200,
            {
                "content": [
                    {"type": "text", "text": "Reading it."},
                    {"type": "tool_use", "id": "tu_9", "name": "read_artifact", "input": {}},
                ],
                "stop_reason": "tool_use",
            },
        )
    )
    model = AnthropicModel(server.endpoint("anthropic"), max_tokens=512)
    turn = model.respond(HISTORY, specs(task))
    assert turn == Turn("Reading it.", (ToolCall("tu_9", "read_artifact", {}),))
    [request] = server.requests
    assert request["path"] == "/v1/messages"
    # The SDK chooses the headers: the key in one of Anthropic's two ways, and a version.
    headers = request["headers"]
    assert "sk-test-key" in headers.get("x-api-key", "") + headers.get("authorization", "")
    assert headers["anthropic-version"]
    body = request["body"]
    assert body["system"] == "Be brief." and body["max_tokens"] == 512
    assert body["tools"] == [spec.definition("anthropic") for spec in specs(task)]
    assert body["messages"] == [
        {"role": "user", "content": "Who merged most?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "c1", "name": "list_prs", "input": {}},
                {"type": "tool_use", "id": "c2", "name": "list_artifacts", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [  # both results of the step in one user message
                {"type": "tool_result", "tool_use_id": "c1", "content": HISTORY[3]["content"]},
                {"type": "tool_result", "tool_use_id": "c2", "content": "[]"},
            ],
        },
    ]
    assert body["messages"] == to_anthropic(HISTORY)[1]


def test_to_anthropic_without_a_system_prompt() -> None:
    system, messages = to_anthropic(HISTORY[1:] + [{"role": "user", "content": "And then?"}])
    assert system == ""
    assert messages[-1] == {"role": "user", "content": "And then?"}
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "user"]


def openai_reply(text: str, calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in calls
        ]
    return {"choices": [{"message": message}]}


def anthropic_reply(text: str, calls: Sequence[ToolCall] = ()) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": dict(c.arguments)} for c in calls
    ]
    return {"content": content}


@pytest.mark.parametrize(
    ("provider", "reply", "last_result"),
    [
        ("openai", openai_reply, lambda body: body["messages"][-1]["content"]),
        ("anthropic", anthropic_reply, lambda body: body["messages"][-1]["content"][0]["content"]),
    ],
)
def test_the_loop_runs_against_an_endpoint(
    server: FakeServer,
    task: Task,
    provider: str,
    reply: Callable[..., dict[str, Any]],
    last_result: Callable[[dict[str, Any]], str],
) -> None:
    server.replies += [
        (200, reply("", [ToolCall("c1", "list_prs", {})])),
        (200, reply("150 PRs.")),
    ]
    model = model_from_endpoint(server.endpoint(provider, "/v1" if provider == "openai" else ""))
    result = run(task, model, "How many PRs?", tools=[UserTool(LIST_PRS, list_prs)])
    assert result.answer == "150 PRs."
    assert len(server.requests) == 2
    # What the endpoint saw of the big result is the notice, not the payload.
    seen = last_result(server.requests[1]["body"])
    fields = parse_notice(seen)
    assert fields is not None and fields["tool"] == "list_prs"
    assert len(json.dumps(server.requests[1]["body"])) < len(json.dumps(PRS)) // 5


def test_an_endpoint_error_is_one_line(server: FakeServer, task: Task) -> None:
    page = b"<html>\n<body>\n<h1>500 Internal Server Error</h1>\n</body>\n</html>\n"
    for provider in ("openai", "anthropic"):
        server.replies.append((500, page))
        model = model_from_endpoint(server.endpoint(provider), max_retries=0)
        with pytest.raises(SpillboxError) as caught:
            model.respond([{"role": "user", "content": "hi"}], specs(task))
        message = str(caught.value)
        assert "\n" not in message, message
        assert "answered 500" in message and "Internal Server Error" in message
        assert "sk-test-key" not in message
        assert caught.value.retryable


@pytest.mark.parametrize(
    ("provider", "reply"), [("openai", openai_reply), ("anthropic", anthropic_reply)]
)
def test_the_sdk_retries_a_failed_call(
    server: FakeServer, task: Task, provider: str, reply: Callable[..., dict[str, Any]]
) -> None:
    server.replies += [(503, b"busy"), (200, reply("fine"))]
    model = model_from_endpoint(server.endpoint(provider, "/v1" if provider == "openai" else ""))
    assert model.respond([{"role": "user", "content": "hi"}], specs(task)).text == "fine"
    assert len(server.requests) == 2


def test_an_endpoint_that_does_not_answer_is_a_clear_error(task: Task) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    model = OpenAIChatModel(ModelEndpoint("openai", f"http://127.0.0.1:{port}", "k", "m"))
    with pytest.raises(SpillboxError, match="did not answer .* check the base URL"):
        model.respond([{"role": "user", "content": "hi"}], specs(task))


def test_the_endpoint_comes_from_the_environment() -> None:
    env = {
        "SPILLBOX_MODEL_PROVIDER": "anthropic",
        "SPILLBOX_MODEL_BASE_URL": "http://127.0.0.1:9",
        "SPILLBOX_MODEL_API_KEY": "secret-key",
        "SPILLBOX_MODEL": "claude-test",
    }
    endpoint = Settings.from_env(env).endpoint
    assert endpoint is not None and "secret-key" not in repr(endpoint)
    assert isinstance(model_from_endpoint(endpoint), AnthropicModel)
    openai = Settings.from_env({**env, "SPILLBOX_MODEL_PROVIDER": "openai"}).endpoint
    assert openai is not None and isinstance(model_from_endpoint(openai), OpenAIChatModel)
    assert Settings.from_env({"SPILLBOX_MODEL": "m"}).endpoint is None  # no key: scripted only


def test_malformed_tool_arguments_reach_the_model_as_an_error(
    server: FakeServer, task: Task
) -> None:
    bad_call = {
        "id": "c9",
        "type": "function",
        "function": {"name": "list_artifacts", "arguments": '{"oops": '},
    }
    server.replies += [
        (200, {"choices": [{"message": {"content": None, "tool_calls": [bad_call]}}]}),
        (200, {"choices": [{"message": {"content": "done"}}]}),
        (200, {"unexpected": True}),
    ]
    model = OpenAIChatModel(server.endpoint("openai", "/v1/"))
    result = run(task, model, "go")
    assert result.answer == "done"
    [tool_message] = [m for m in result.messages if m["role"] == "tool"]
    assert "not valid JSON" in json.loads(tool_message["content"])["error"]
    with pytest.raises(SpillboxError, match="unexpected reply"):
        model.respond([{"role": "user", "content": "hi"}], specs(task))


# Budgets in the loop


def log_tool(arguments: Mapping[str, Any]) -> str:
    step = int(arguments.get("step", 0))
    return "".join(f"step {step} line {n}: status ok, cache hit\n" for n in range(120))


LOGS = ToolSpec("logs", "A build step's log.", {"type": "object", "properties": {}})


def long_session(steps: int) -> Callable[[Sequence[Mapping[str, Any]]], Turn]:
    """Read one step's log per turn (each ~1.4k tokens, inline under the gate's 6k), then
    answer; the model sees only what the loop sends it."""

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        # the latest call stays in the history whatever was archived: count from it
        ids = [int(m["tool_call_id"][1:]) for m in messages if m.get("role") == "tool"]
        done = max(ids, default=-1) + 1
        if done >= steps:
            return Turn("All steps read.")
        return Turn("", (ToolCall(f"c{done}", "logs", {"step": done}),))

    return script


def test_the_loop_checks_the_budget_before_every_model_call(task: Task) -> None:
    calls: list[int] = []

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        calls.append(len(messages))
        return long_session(3)(messages)

    budget = Budget(window=200_000)
    result = run(task, ScriptedModel(script), "Read three logs.", [UserTool(LOGS, log_tool)],
                 budget=budget)  # fmt: skip
    assert result.answer == "All steps read."
    assert len(result.reports) == len(calls) == 4
    assert [r.route("tool_results").used > 0 for r in result.reports] == [False, True, True, True]
    assert all(not r.stages for r in result.reports)


def test_a_long_session_stays_inside_a_small_window_with_the_fallback(task: Task) -> None:
    budget = Budget(window=32_000)
    result = run(
        task,
        ScriptedModel(long_session(40)),
        "Read all forty logs.",
        [UserTool(LOGS, log_tool)],
        system="You are a careful build engineer.",
        max_steps=60,
        budget=budget,
        compactor=Fallback(task),
    )
    assert result.answer == "All steps read."
    assert len(result.steps) >= 40
    assert all(not r.over_hard for r in result.reports)
    assert max(r.input_tokens for r in result.reports) <= budget.input_limit
    stages = {s.name for r in result.reports for s in r.stages}
    # The conversation shares the window (issue 25 item 8): older results becoming notices
    # is enough here, and nothing compacts before a request fills 70% of the input limit.
    assert "tool_results" in stages
    first = next(i for i, r in enumerate(result.reports) if r.stages)
    assert result.reports[first - 1].input_tokens >= 0.7 * budget.input_limit
    assert result.messages[:2] == [
        {"role": "system", "content": "You are a careful build engineer."},
        {"role": "user", "content": "Read all forty logs."},
    ]


def test_late_in_a_session_the_dynamic_per_call_limit_offloads_smaller_results(
    home: Path,
) -> None:
    """Each log (~1.4k tokens) is far under the fixed 6k; with 30% of what the
    tool_results route has left as the limit, the later ones go to the sandbox, and the
    session fits where the fixed limit alone runs out of room (routes of their own, no
    compactor: the tool_results route's 30% is all the results get)."""
    budget = Budget(window=32_000, share_room=False)
    session = (ScriptedModel(long_session(10)), "Read ten logs.", [UserTool(LOGS, log_tool)])
    dynamic = Policy(per_call_share=0.3)
    with Harness(sandbox="none", home=home, policy=dynamic, gc_interval=-1) as harness:
        with harness.task("dynamic") as task:
            result = run(task, *session, budget=budget, compactor=None)
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        with harness.task("fixed") as task, pytest.raises(BudgetExceeded) as raised:
            run(task, *session, budget=budget, compactor=None)
    offloaded = [item.offloaded for step in result.steps for item in step.admitted]
    assert offloaded[:3] == [False] * 3 and offloaded[-3:] == [True] * 3, offloaded
    notice = parse_notice(result.steps[-1].admitted[0].text)
    assert notice is not None
    room = result.reports[-2].room("tool_results")
    assert notice["reason"] == (
        f"per_call (over the {int(0.3 * room)}-token dynamic per-call limit: 30% of the "
        f"{room} tokens left for tool results)"
    )
    assert raised.value.route == "tool_results"


def test_a_budget_too_small_for_the_system_prompt_fails_before_any_call(task: Task) -> None:
    calls: list[int] = []

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        calls.append(1)
        return Turn("never")

    budget = Budget(window=4_000, routes={**default_routes(4_000), "system": 20})
    with pytest.raises(BudgetExceeded, match="raise routes\\['system'\\]") as raised:
        run(task, ScriptedModel(script), "go", system="You are careful. " * 20, budget=budget)
    assert raised.value.route == "system" and raised.value.limit == 20
    assert calls == []


def test_anthropic_native_compaction_goes_with_the_request_and_its_block_comes_back(
    server: FakeServer, task: Task
) -> None:
    budget = Budget(window=200_000, model="claude-sonnet-4-6")
    plan = plan_native("anthropic", "claude-sonnet-4-6", budget)
    compaction = {"type": "compaction", "content": "Read logs 0-9; all ok."}
    server.replies += [
        (
            200,
            {
                "content": [
                    compaction,
                    {"type": "tool_use", "id": "t1", "name": "logs", "input": {}},
                ]
            },
        ),
        (200, {"content": [{"type": "text", "text": "done"}]}),
    ]
    model = AnthropicModel(server.endpoint("anthropic"), native=plan)
    result = run(task, model, "go", [UserTool(LOGS, log_tool)], budget=budget,
                 compactor=Native(task, plan))  # fmt: skip
    assert result.answer == "done"
    first, second = server.requests
    assert first["headers"]["anthropic-beta"] == ANTHROPIC_COMPACTION_BETA
    assert first["body"]["context_management"] == plan.params["context_management"]
    assistant = second["body"]["messages"][1]
    assert assistant["role"] == "assistant" and assistant["content"][0] == compaction
    # Anthropic reads nothing before the compaction block: the budget counts the summary,
    # not the turns it replaced
    before, after = result.reports
    summary = budget.counter.count(compaction["content"])
    assert before.route("history").used == 4 + budget.counter.count("go")
    assert after.route("history").used == 4 + summary + budget.counter.count("logs" + "{}")


def responses_reply(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "gpt-5.4",
        "status": "completed",
        "output": output,
    }


def test_openai_responses_compaction_goes_with_the_request_and_its_item_comes_back(
    server: FakeServer, task: Task
) -> None:
    budget = Budget(window=400_000, model="gpt-5.4")
    plan = plan_native("responses", "gpt-5.4", budget, store=False)
    compaction = {"type": "compaction", "id": "cmp_1", "encrypted_content": "opaque"}
    call = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "c1",
        "name": "logs",
        "arguments": '{"step": 1}',
        "status": "completed",
    }
    answer = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "done", "annotations": []}],
    }
    server.replies += [(200, responses_reply([compaction, call])), (200, responses_reply([answer]))]
    model = OpenAIResponsesModel(server.endpoint("openai", "/v1"), native=plan)
    result = run(task, model, "go", [UserTool(LOGS, log_tool)], system="Be brief.",
                 budget=budget, compactor=Native(task, plan))  # fmt: skip
    assert result.answer == "done"
    first, second = server.requests
    assert first["path"] == "/v1/responses"
    body = first["body"]
    assert body["context_management"] == [{"type": "compaction", "compact_threshold": 272_000}]
    assert body["store"] is False and body["instructions"] == "Be brief."
    assert body["tools"][0] == LOGS.definition("responses")
    assert second["body"]["input"] == [  # nothing before the latest compaction item
        compaction,
        {"type": "function_call", "call_id": "c1", "name": "logs", "arguments": '{"step": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": log_tool({"step": 1})},
    ]
    for request in (first, second):
        TypeAdapter(ResponseCreateParamsNonStreaming).validate_python(request["body"])
        TypeAdapter(ResponseInputParam).validate_python(request["body"]["input"])
