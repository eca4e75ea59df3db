"""spillbox inside the Claude Agent SDK (issue 26): the real `claude` CLI (installed by `make
install`) pointed at a local fake Messages API that scripts the model's turns and records
every request, so each assertion is on what the model received. The scenario runs once per
runtime (runc, gVisor) in a real Docker sandbox; the tests read its record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from claude_agent_sdk import (
    ClaudeAgentOptions,
    SystemMessage,
    ToolAnnotations,
    create_sdk_mcp_server,
    query,
    tool,
)
from framework_scenario import (
    CONFIG,
    EVENTS,
    OPEN_TOTAL,
    ORDERS,
    PARALLEL,
    SECRET,
    SMALL,
    TOOLS,
    USERS,
    check_sizes,
    notice_of,
    open_total_sql,
    tokens,
)

from spillbox import Harness
from spillbox.integrations.claude_agent import CHECKOUT_CLI, OFFLINE_ENV, SpillboxSession
from spillbox.integrations.fake_messages import FakeMessagesAPI, Turn, text, tool_use
from spillbox.retention import Retention
from spillbox.sandbox.docker import SandboxOptions, cleanup_home

pytest_plugins = ["framework_fixtures"]  # the runtime and docker_harness fixtures

pytestmark = pytest.mark.docker


def received(body: dict[str, Any]) -> dict[str, Any]:
    """The tool results of a request's last message, by call id: their content as sent."""
    return {
        block["tool_use_id"]: block["content"]
        for block in body["messages"][-1]["content"]
        if block.get("type") == "tool_result"
    }


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(block["text"] for block in content if block["type"] == "text")


def data_tools(read_only: bool = True, failing: str = "") -> Any:
    """The user's own tools (an in-process MCP server "data"): read-only ones the CLI runs
    at once within a turn, others one at a time; the tool named failing raises."""
    annotations = ToolAnnotations(readOnlyHint=read_only)

    def make(name: str, text: str) -> Any:
        @tool(name, f"The {name} records.", {}, annotations=annotations)
        async def handler(arguments: dict[str, Any]) -> dict[str, Any]:
            if name == failing:
                raise RuntimeError(f"{name} is down")
            return {"content": [{"type": "text", "text": text}]}

        return handler

    return create_sdk_mcp_server("data", tools=[make(n, t) for n, t in TOOLS.items()])


@dataclass
class Run:
    """What one scripted session left: the requests, the session's id, the task."""

    fake: FakeMessagesAPI
    session_id: str
    task_id: str
    stored: dict[str, bytes] = field(default_factory=dict)
    state_after_close: str = ""


def _script(secret_file: Path) -> list[Turn]:
    found: dict[str, Any] = {}

    def parallel(body: dict[str, Any]) -> list[dict[str, Any]]:
        return [tool_use(f"call_{n}", f"mcp__data__{n}", {}) for n in PARALLEL]

    def more(body: dict[str, Any]) -> list[dict[str, Any]]:
        found["orders"] = notice_of(text_of(received(body)["call_list_orders"]))
        return [
            tool_use("call_get_config", "mcp__data__get_config", {}),
            tool_use("call_ping", "mcp__data__ping", {}),
            tool_use("call_cat", "Bash", {"command": f"cat {secret_file}"}),
            tool_use("call_file", "Read", {"file_path": str(secret_file)}),
            tool_use(
                "call_grep",
                "Grep",
                {"pattern": "region", "path": str(secret_file), "output_mode": "content"},
            ),  # fmt: skip
        ]

    def read_back(body: dict[str, Any]) -> list[dict[str, Any]]:
        notice = found["orders"]
        assert notice is not None, "the orders were not offloaded"
        [hint] = [h for h in notice["hint"].splitlines() if "read_artifact" in h]
        name, _, arguments = hint.partition(" ")
        return [tool_use("call_read", name, json.loads(arguments))]

    def query_sql(body: dict[str, Any]) -> list[dict[str, Any]]:
        arguments = {"lang": "sql", "code": open_total_sql(found["orders"])}
        return [tool_use("call_sql", "mcp__spillbox__sandbox_exec", arguments)]

    def answer(body: dict[str, Any]) -> list[dict[str, Any]]:
        output = json.loads(text_of(received(body)["call_sql"]))["output"]
        return [text(f"The open orders total {output.split()[-1]}.")]

    return [parallel, more, read_back, query_sql, answer]


async def _session(
    harness: Harness,
    fake: FakeMessagesAPI,
    tmp: Path,
    data: Any,
    allowed: list[str],
    retention: Retention | None = None,
) -> Run:
    """One query() through a SpillboxSession, the CLI talking to fake."""
    options = ClaudeAgentOptions(
        mcp_servers={"data": data},
        tools=["Bash", "Read", "Grep"],
        allowed_tools=allowed,
        permission_mode="dontAsk",
        setting_sources=[],
        cwd=str(tmp),
        env={
            **OFFLINE_ENV,
            "ANTHROPIC_BASE_URL": fake.url,
            "ANTHROPIC_API_KEY": "sk-fake",
            "HOME": str(tmp / "home"),
        },  # fmt: skip
    )
    async with SpillboxSession(harness, options, retention=retention) as spill:
        session_id = ""
        async for message in query(prompt="Sum the open orders.", options=spill.options):
            if isinstance(message, SystemMessage) and message.subtype == "init":
                session_id = message.data["session_id"]
        run = Run(fake, session_id, spill.task.id)
        run.stored = {row.tool: spill.task.read(row) for row in spill.task.artifacts()}
    run.state_after_close = harness.catalog.task(run.task_id).state  # type: ignore[union-attr]
    return run


def _tmp(factory: pytest.TempPathFactory) -> Path:
    assert CHECKOUT_CLI.exists(), "the claude CLI is missing: run make install"
    tmp = factory.mktemp("claude")
    (tmp / "home").mkdir()
    return tmp


@pytest.fixture(scope="module")
def run(runtime: str | None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    check_sizes()
    tmp = _tmp(tmp_path_factory)
    secret_file = tmp / "config.json"
    secret_file.write_text(CONFIG)
    fake = FakeMessagesAPI(_script(secret_file))
    options = SandboxOptions(runtime=runtime)
    home = tmp / "spillbox"
    try:
        with Harness(sandbox="docker", home=home, options=options, gc_interval=-1) as harness:
            allowed = [f"mcp__data__{n}" for n in TOOLS] + ["Bash", "Read", "Grep"]
            retention = Retention(redact=True, keep_after_close=0)
            yield anyio.run(_session, harness, fake, tmp, data_tools(), allowed, retention)
    finally:
        fake.close()
        cleanup_home(home)


def test_the_step_is_gated_as_one_aggregate(run: Run) -> None:
    """The three parallel results: the orders offloaded for themselves, then the users until
    the step fits 10k; the events inline, exactly as the tool returned them."""
    shown = received(run.fake.requests[1])
    assert set(shown) == {f"call_{n}" for n in PARALLEL}
    orders, users, events = (text_of(shown[f"call_{n}"]) for n in PARALLEL)
    assert notice_of(orders) is not None and notice_of(users) is not None
    assert events == EVENTS
    assert sum(tokens(text_of(c)) for c in shown.values()) <= 10_000
    assert run.stored["mcp__data__list_orders"] == ORDERS.encode()
    assert run.stored["mcp__data__list_users"] == USERS.encode()


def test_hints_name_the_tools_the_model_has(run: Run) -> None:
    offered = {t["name"] for t in run.fake.requests[0]["tools"]}
    notice = notice_of(text_of(received(run.fake.requests[1])["call_list_orders"]))
    assert notice is not None
    named = {line.partition(" ")[0] for line in notice["hint"].splitlines()}
    assert named == {"mcp__spillbox__sandbox_exec", "mcp__spillbox__read_artifact"}
    assert named <= offered and "mcp__spillbox__list_artifacts" in offered


def test_the_model_reads_the_payload_back_and_answers_exactly(run: Run) -> None:
    page = json.loads(text_of(received(run.fake.requests[3])["call_read"]))
    assert page["items"] == json.loads(ORDERS)[: len(page["items"])] and page["items"]
    result = json.loads(text_of(received(run.fake.requests[4])["call_sql"]))
    assert result["exit_code"] == 0, result
    assert result["output"].split()[-1] == str(OPEN_TOTAL)


def test_a_secret_never_reaches_the_model(run: Run) -> None:
    """Under a redacting policy: neither an MCP tool's result nor Bash's, Read's or Grep's
    output carries it (each the rest of its result: the CLI took each tool's shape back)."""
    shown = received(run.fake.requests[2])
    for call in ("call_get_config", "call_cat", "call_file", "call_grep"):
        assert "eu-west-1" in text_of(shown[call]), shown[call]
    assert all(SECRET not in json.dumps(body) for body in run.fake.requests)


def test_a_small_result_passes_untouched(run: Run) -> None:
    assert received(run.fake.requests[2])["call_ping"] == [{"type": "text", "text": SMALL}]


def test_one_task_per_session_and_its_retention_at_the_end(run: Run) -> None:
    assert run.session_id and run.task_id == run.session_id
    assert run.state_after_close == "deleted"
    assert len(run.fake.requests) == 5 and run.fake.others == []


def test_calls_the_cli_runs_one_at_a_time_are_steps_of_one(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Tools that are not read-only run one after another, each hook before the next call
    starts: the aggregate cannot hold their results together, so 5.6k and 4.5k both stay
    inline (each under the per-call limit) though together they pass 10k."""
    tmp = _tmp(tmp_path_factory)
    calls = [tool_use(f"call_{n}", f"mcp__data__{n}", {}) for n in ("list_users", "list_events")]
    fake = FakeMessagesAPI([lambda body: calls, lambda body: [text("done")]])
    allowed = [f"mcp__data__{n}" for n in TOOLS]
    try:
        with Harness(sandbox="none", home=tmp / "spillbox", gc_interval=-1) as harness:
            anyio.run(_session, harness, fake, tmp, data_tools(read_only=False), allowed)
    finally:
        fake.close()
    shown = received(fake.requests[1])
    assert text_of(shown["call_list_users"]) == USERS
    assert text_of(shown["call_list_events"]) == EVENTS


def test_a_failed_or_refused_call_leaves_its_step(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A call that fails (PostToolUseFailure) and one the CLI refuses after PreToolUse (no
    hook hears of it) do not keep the rest of the step from its aggregate: users and events
    together pass 10k, so the users are offloaded; the next turn's step is gated too."""
    tmp = _tmp(tmp_path_factory)
    turn = [tool_use(f"call_{n}", f"mcp__data__{n}", {}) for n in ("list_users", "list_events")]
    turn += [
        tool_use("call_ping", "mcp__data__ping", {}),
        tool_use("call_cfg", "mcp__data__get_config", {}),
    ]
    again = [tool_use(f"again_{n}", f"mcp__data__{n}", {}) for n in ("list_users", "list_events")]
    fake = FakeMessagesAPI([lambda b: turn, lambda b: again, lambda b: [text("done")]])
    allowed = [f"mcp__data__{n}" for n in TOOLS if n != "get_config"]  # get_config: refused
    try:
        with Harness(sandbox="none", home=tmp / "spillbox", gc_interval=-1) as harness:
            data = data_tools(failing="ping")
            anyio.run(_session, harness, fake, tmp, data, allowed)
    finally:
        fake.close()
    for body, prefix in ((fake.requests[1], "call"), (fake.requests[2], "again")):
        shown = received(body)
        assert notice_of(text_of(shown[f"{prefix}_list_users"])) is not None
        assert text_of(shown[f"{prefix}_list_events"]) == EVENTS
    first = received(fake.requests[1])
    assert "ping is down" in text_of(first["call_ping"])
    assert "denied" in text_of(first["call_cfg"])
