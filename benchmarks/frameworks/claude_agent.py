"""Claude Agent SDK, in process, the row judged: the hooks the CLI calls for one small MCP
result, PreToolUse then PostToolUse, SpillboxSession's against no-op hooks, called as the SDK
calls them.

End to end, for context: the real `claude` CLI (from `make install`) against the local fake
Messages API, which scripts turn after turn of that one call. A call's time is what the CLI
takes between the model's answer and its next request (the tool, its hooks, the CLI's own
work), as the fake sees it; sessions without hooks, with no-op hooks and with SpillboxSession
alternate. The CLI's own time varies by tens of milliseconds from call to call on a loaded
machine, so these rows show the order of things, not spillbox's cost."""

from __future__ import annotations

import itertools
import tempfile
import time
from dataclasses import replace
from typing import Any

from frameworks import SMALL, Row, alternate, event_loop, harness

SESSIONS = 3
"""CLI sessions a side, alternated."""
CALLS = 40
"""Calls a CLI session."""
QUICK_CALLS = 6
HOOK_CALLS = 2000
QUICK_HOOK_CALLS = 200
FRAMEWORK = "Claude Agent SDK"
NOTE = (
    "the hooks row calls PreToolUse and PostToolUse as the SDK does; the CLI rows time the "
    "real `claude` CLI between the fake Messages API's answer and its next request, whose "
    "own variance (tens of ms) swamps spillbox's cost: context, not judged."
)


async def _noop(data: Any, tool_use_id: Any, context: Any) -> dict[str, Any]:
    return {}


def rows(quick: bool) -> list[Row]:
    from spillbox.integrations.claude_agent import SpillboxSession

    hook_calls, calls = (QUICK_HOOK_CALLS, QUICK_CALLS) if quick else (HOOK_CALLS, CALLS)
    with harness() as made, event_loop() as run, tempfile.TemporaryDirectory() as tmp:
        spill = SpillboxSession(made)
        [pre] = spill.options.hooks["PreToolUse"]  # type: ignore[index]
        [post] = spill.options.hooks["PostToolUse"]  # type: ignore[index]
        ids = (f"c{i}" for i in itertools.count())  # a call id of its own each call
        hooks = alternate(
            [
                lambda: [run(_hook_pair(_noop, _noop, spill.task.id, next(ids)))],
                lambda: [run(_hook_pair(pre.hooks[0], post.hooks[0], spill.task.id, next(ids)))],
            ],
            hook_calls,
        )
        run(spill.aclose())
        made.remove(spill.task.id, by="manual")
        bare, noop, spillbox = alternate(
            [
                lambda side=side: run(_session(made, calls, side, tmp))
                for side in ("bare", "hooks", "spillbox")
            ],
            SESSIONS,
            warmup=0,
        )
    cli = SESSIONS * (calls - 2)
    return [
        Row(
            FRAMEWORK, "PreToolUse + PostToolUse hooks, in process", *hooks, hook_calls, judged=True
        ),
        Row(FRAMEWORK, "CLI end to end: no hooks / no-op hooks", bare, noop, cli),
        Row(FRAMEWORK, "CLI end to end: no-op hooks / spillbox's", noop, spillbox, cli),
    ]


async def _hook_pair(before: Any, after: Any, session_id: str, call_id: str) -> float:
    """The ms of a PreToolUse + PostToolUse pair for one small MCP result."""
    call = {
        "session_id": session_id,
        "transcript_path": "",
        "cwd": "/",
        "tool_name": "mcp__data__ping",
        "tool_input": {},
    }
    started = time.perf_counter()
    await before({**call, "hook_event_name": "PreToolUse"}, call_id, {"signal": None})
    response = [{"type": "text", "text": SMALL}]
    ended = {**call, "hook_event_name": "PostToolUse", "tool_response": response}
    await after(ended, call_id, {"signal": None})
    return (time.perf_counter() - started) * 1000


async def _session(harness: Any, calls: int, side: str, tmp: str) -> list[float]:
    """One CLI session of `calls` turns of one small call, each call's ms as the fake saw it.
    side: "bare", "hooks" (no-op PreToolUse and PostToolUse hooks) or "spillbox"."""
    from claude_agent_sdk import (
        ClaudeAgentOptions,
        HookMatcher,
        ToolAnnotations,
        create_sdk_mcp_server,
        query,
        tool,
    )

    from spillbox.integrations.claude_agent import CHECKOUT_CLI, OFFLINE_ENV, SpillboxSession
    from spillbox.integrations.fake_messages import FakeMessagesAPI, text, tool_use

    @tool("ping", "ping", {}, annotations=ToolAnnotations(readOnlyHint=True))
    async def ping(arguments: dict[str, Any]) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": SMALL}]}

    turns = [lambda body, i=i: [tool_use(f"c{i}", "mcp__data__ping", {})] for i in range(calls)]
    fake = FakeMessagesAPI([*turns, lambda body: [text("done")]])
    options = ClaudeAgentOptions(
        mcp_servers={"data": create_sdk_mcp_server("data", tools=[ping])},
        allowed_tools=["mcp__data__ping"],
        tools=[],
        permission_mode="dontAsk",
        setting_sources=[],
        cwd=tmp,
        max_turns=calls + 2,
        env={
            **OFFLINE_ENV,
            "ANTHROPIC_BASE_URL": fake.url,
            "ANTHROPIC_API_KEY": "sk-fake",
            "HOME": tmp,
        },  # fmt: skip
    )
    try:
        if side == "spillbox":
            async with SpillboxSession(harness, options) as spill:
                async for _ in query(prompt="ping", options=spill.options):
                    pass
        else:
            noop = {e: [HookMatcher(hooks=[_noop])] for e in ("PreToolUse", "PostToolUse")}
            plain = replace(options, cli_path=CHECKOUT_CLI, hooks=noop if side == "hooks" else None)
            async for _ in query(prompt="ping", options=plain):
                pass
    finally:
        fake.close()
    # The first call also starts the MCP connection's work: left out of both sides.
    return [
        (fake.arrived[i + 1] - fake.answered[i]) * 1000 for i in range(1, len(fake.answered) - 1)
    ]
