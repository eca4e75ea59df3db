"""Attacks on redaction through code mode (issue 21, item 4): under a redacting policy a
script's stderr and the SQL engine's error messages reach the model redacted, as its stdout
does. Under runc and again under gVisor."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import test_attacks

from redaction_corpus import github_pat
from spillbox import Harness, Retention, Task
from spillbox.tools import Toolset

pytestmark = pytest.mark.docker

harness = test_attacks.harness
"""A docker harness, under runc and again under gVisor."""


@pytest.fixture
def task(harness: Harness) -> Iterator[Task]:
    task = harness.task("redacting", retention=Retention(redact=True))
    yield task
    task.close(delete=True)


def test_stderr_and_sql_errors_reach_the_model_redacted(task: Task) -> None:
    toolset = Toolset(task)
    calls = {
        # DuckDB's conversion error quotes the value it could not cast.
        "sql": f"SELECT CAST('{github_pat}' AS INTEGER)",
        # A traceback quotes the value it choked on; a log line on stderr holds a key.
        "python": (
            "import sys\n"
            f"print('connecting with api_key=' + {github_pat!r}, file=sys.stderr)\n"
            f"raise ValueError({{'token': {github_pat!r}}})\n"
        ),
        "sh": f"echo 'auth failed for {github_pat}' >&2; exit 3",
    }
    for lang, code in calls.items():
        out = toolset.call("sandbox_exec", {"lang": lang, "code": code})
        result = json.loads(out.text)
        assert out.is_error and result["exit_code"] != 0, (lang, result)
        assert github_pat not in out.text, (lang, result["stderr"])
        assert "[REDACTED:github_pat]" in result["stderr"], (lang, result["stderr"])
    sql = task.exec("sql", f"SELECT CAST('{github_pat}' AS INTEGER)")
    assert "Conversion Error" in sql.stderr and github_pat not in sql.stderr


def test_without_redaction_stderr_is_passed_as_it_is(harness: Harness) -> None:
    task = harness.task("plain")
    try:
        result = task.exec("sh", f"echo 'token {github_pat}' >&2; exit 1")
        assert result.stderr.strip() == f"token {github_pat}"
    finally:
        task.close(delete=True)
