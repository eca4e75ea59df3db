"""Attacks on spillbox's ADK integration: sessions that try to share a task, a turn whose
call names no tool, and results ADK would carry that the gate must not lose."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from framework_scenario import ORDERS, SECRET, notice_of
from test_google_adk import app_runner, once, received, run, tool

from spillbox import Harness, Retention

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with Harness(sandbox="none", home=tmp_path / "home", gc_interval=-1) as harness:
        yield harness


async def test_ids_with_slashes_never_share_a_task(harness: Harness) -> None:
    """User "a/b" with session "c" and user "a" with session "b/c" would both be a/b/c if
    the parts were joined as they are: each must get a task of its own, and neither sees
    the other's artifacts."""
    from spillbox.integrations.google_adk import SpillboxPlugin

    spillbox = SpillboxPlugin(harness)
    first = app_runner(spillbox, once(("list_orders", {})), [tool("list_orders", ORDERS)])
    await run(first, "c", user_id="a/b")
    await run(first, "b/c", user_id="a")
    ids = [t for t in harness.tasks() if t.startswith("adk/")]
    assert sorted(ids) == ["adk/shop/a%2Fb/c", "adk/shop/a/b%2Fc"]
    assert all(len(harness.existing(t).artifacts()) == 1 for t in ids)
    await first.close()


async def test_a_call_to_no_tool_leaves_the_rest_of_its_turn_gated(harness: Harness) -> None:
    """A turn of three calls, one naming a tool that does not exist (ADK answers it without
    an after-tool callback): the other two are still gated, together, once the step's bound
    has passed, and the secret in one of them never reaches the model."""
    from spillbox.integrations.google_adk import SpillboxPlugin

    spillbox = SpillboxPlugin(harness, retention=Retention(redact=True))
    config = json.dumps({"aws_access_key_id": SECRET})
    tools = [tool("list_orders", ORDERS), tool("get_config", config)]
    script = once(("list_orders", {}), ("get_config", {}), ("no_such_tool", {}))
    runner = app_runner(spillbox, script, tools)
    try:
        await run(runner)
        model = runner.app.root_agent.model  # type: ignore[union-attr]
        got = received(model.seen[-1].contents)
        assert notice_of(got["list_orders"][0]["result"]) is not None
        assert SECRET not in json.dumps(got) and "no_such_tool" in got
    finally:
        await runner.close()


async def test_a_result_that_is_not_json_is_gated_as_its_text(harness: Harness) -> None:
    """A tool may return any value (ADK hands callbacks what the tool returned): one that
    json cannot write is counted as its text, not dropped and not an error."""
    from spillbox.integrations.google_adk import SpillboxPlugin

    class Opaque:
        def __str__(self) -> str:
            return ORDERS

    spillbox = SpillboxPlugin(harness)
    runner = app_runner(spillbox, once(("opaque", {})), [tool("opaque", {"rows": Opaque()})])
    try:
        await run(runner)
        model = runner.app.root_agent.model  # type: ignore[union-attr]
        [shown] = received(model.seen[-1].contents)["opaque"]
        notice = notice_of(shown["result"])
        assert notice is not None and notice["tool"] == "opaque"
    finally:
        await runner.close()
