"""Hints for an offloaded binary-heavy JSON answer (issue 22 item 3): an MCP result whose
embedded resources carry images' base64, or records with a base64 field, get hints that
cut long strings, so that each hint, run in a real sandbox, answers in a few lines (the
records' names and types) instead of printing the base64 into another notice.

Each test runs under runc and under gVisor (runsc), as tests/sandbox/test_attacks.py does.
"""

from __future__ import annotations

import base64
import json
import random
import re
from typing import Any

import pytest
import test_attacks

from spillbox import Task, ToolResult, parse_notice

pytestmark = pytest.mark.docker

harness = test_attacks.harness
"""A docker harness, under runc and again under gVisor."""
task = test_attacks.task

BASE64_RUN = re.compile(r"[A-Za-z0-9+/=]{200}")


def blob(size: int, seed: int) -> str:
    return base64.b64encode(random.Random(seed).randbytes(size)).decode()


def run_hints(task: Task, call_id: str, payload: Any) -> list[str]:
    """Offload payload, run each of its notice's hints; every answer, checked to answer."""
    [admitted] = task.admit([ToolResult(call_id, "media", json.dumps(payload))])
    fields = parse_notice(admitted.text)
    assert admitted.offloaded and fields is not None, admitted.text
    answers = []
    for line in fields["hint"].splitlines():
        lang, _, code = line.partition(": ")
        assert lang in ("sql", "sh"), line
        result = task.exec(lang, code, timeout=120)  # type: ignore[arg-type]
        assert result.exit_code == 0, (code, result.stderr)
        assert not BASE64_RUN.search(result.text), (code, result.text[:500])
        tokens = task.counter.count(result.text)
        assert tokens < task.policy.per_call_tokens // 4, (code, tokens)
        answers.append(result.text)
    return answers


def test_an_mcp_result_of_embedded_images_gets_hints_that_answer(task: Task) -> None:
    """What the proxy stores of a result with embedded resources (spillbox.mcp.results):
    its text and the resources, each blob 40 KB of base64."""
    resources = [
        {
            "type": "resource",
            "resource": {"uri": f"file:///pictures/{i}.png", "mimeType": "image/png"}
            | {"blob": blob(30_000, i)},
        }
        for i in range(6)
    ]
    answers = run_hints(task, "media_1", {"text": "six pictures", "resources": resources})
    sql, records, envelope = answers
    assert "file:///pictures/0.png" in sql and "image/png" in sql, sql
    [first, second] = [json.loads(line) for line in records.splitlines()]
    assert first["resource"]["uri"] == "file:///pictures/0.png"
    assert second["resource"]["blob"].endswith("... (40000 chars)"), second
    assert json.loads(envelope) == {"text": "six pictures"}


def test_records_with_a_base64_field_get_hints_that_answer(task: Task) -> None:
    rows = [{"name": f"scan-{i}.tiff", "pages": i % 4, "data": blob(20_000, i)} for i in range(8)]
    count, sample = run_hints(task, "media_2", rows)
    assert count.split() == ["n", "8"], count
    assert "scan-0.tiff" in sample and "scan-4.tiff" in sample, sample
