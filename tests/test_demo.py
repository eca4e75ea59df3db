"""The demo's scenarios, run in real sandboxes: right answers for a fraction of the tokens."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from spillbox.demo import (
    Scenario,
    crm_search,
    metrics,
    pull_requests,
    run_demo,
    run_scenario,
)
from spillbox.harness import Harness
from spillbox.notice import parse_notice

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("make", [pull_requests, metrics, crm_search])
def test_scenario_answers_correctly_with_far_fewer_tokens(
    docker_home: Path, make: Callable[[], Scenario]
) -> None:
    scenario = make()
    harness = Harness(sandbox="docker", home=docker_home, gc_interval=-1)
    try:
        task = harness.task(f"test-{scenario.name}")
        try:
            result = run_scenario(task, scenario)
        finally:
            task.close(delete=True)
    finally:
        harness.close()
    assert result.answer == result.expected, result.transcript
    assert result.correct
    # The payload is offloaded: the model saw a notice, never the payload.
    tool_messages = [m for m in result.transcript if m["role"] == "tool"]
    assert parse_notice(tool_messages[0]["content"]) is not None
    assert result.context_tokens < result.inline_tokens / 50
    assert result.inline_tokens > 50_000


def test_run_demo_returns_1_when_an_answer_is_wrong(docker_home: Path) -> None:
    wrong = replace(pull_requests(), expected="somebody else")
    out = io.StringIO()
    assert run_demo(home=str(docker_home), chosen=[wrong], console=Console(file=out)) == 1
    assert "NO" in out.getvalue()


def test_run_demo_prints_transcripts_and_tables_and_returns_0(docker_home: Path) -> None:
    out = io.StringIO()
    code = run_demo(home=str(docker_home), console=Console(file=out, width=120))
    text = out.getvalue()
    assert code == 0, text
    assert text.count("[spillbox offloaded v1]") == 3
    assert "spillbox demo: summary" in text
    for name in ("pull_requests", "metrics", "crm_search"):
        assert name in text
    # Each scenario's task was deleted after it ran.
    harness = Harness(sandbox="docker", home=docker_home, gc_interval=-1)
    try:
        assert harness.tasks() == []
    finally:
        harness.close()
