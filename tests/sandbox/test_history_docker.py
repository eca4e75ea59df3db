"""The task's one history in a real sandbox (issue 25 item 3), under runc and gVisor: every
archived turn is one SQL table and one file for grep, and appending to it leaves the
model's session and work files alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import GVISOR, runtime_or_skip
from spillbox import Harness, Task
from spillbox.history import HISTORY_REF, History
from spillbox.sandbox.docker import SandboxOptions
from spillbox.tools import Toolset

pytestmark = pytest.mark.docker


@pytest.fixture(params=[None, GVISOR], ids=["runc", "gvisor"])
def task(request: pytest.FixtureRequest, docker_client: Any, docker_home: Path) -> Iterator[Task]:
    runtime = runtime_or_skip(docker_client, request.param)
    options = SandboxOptions(runtime=runtime)
    with Harness(sandbox="docker", home=docker_home, options=options, gc_interval=-1) as harness:
        task = harness.task("history")
        yield task
        task.close(delete=True)


def sql(toolset: Toolset, code: str) -> str:
    output = toolset.call(
        "sandbox_exec", {"lang": "sql", "code": code, "artifact": None, "timeout": 60}
    )
    body = json.loads(output.text)
    assert body["exit_code"] == 0, body
    return str(body["output"])


def test_every_archived_turn_is_one_table_and_one_file(task: Task) -> None:
    history = History(task)
    for i in range(3):  # three appends to the one artifact
        history.append(
            [
                {"role": "user", "content": f"step {i}: why did unit {i} fail?"},
                {"role": "assistant", "content": f"unit {i} timed out \u2028 after 30 s"},
            ]
        )
    toolset = Toolset(task)
    live = task.artifact(HISTORY_REF)
    assert live.artifact_id == [r for r in task.artifacts() if r.tool == live.tool][-1].artifact_id
    counted = sql(toolset, f'SELECT role, count(*) AS n FROM "{live.artifact_id}" GROUP BY role')
    assert "user" in counted and "assistant" in counted and "3" in counted
    grep = toolset.call(
        "sandbox_exec",
        {"lang": "sh", "code": f"grep -c 'timed out' {live.path}", "artifact": None,
         "timeout": 60},
    )  # fmt: skip
    assert json.loads(grep.text)["output"].strip() == "3"
    found = json.loads(
        toolset.call(
            "search_artifacts", {"query": "unit 2 FAIL", "top_k": None, "artifact": None}
        ).text
    )
    assert [(h["artifact_id"], h["line"]) for h in found["results"]] == [(live.artifact_id, 4)]


def run(toolset: Toolset, lang: str, code: str, session: bool = False) -> dict[str, Any]:
    args = {"lang": lang, "code": code, "artifact": None, "timeout": 60, "session": session,
            "reset_session": None}  # fmt: skip
    body: dict[str, Any] = json.loads(toolset.call("sandbox_exec", args).text)
    return body


def test_appending_to_the_history_leaves_the_session_and_work_files_alone(task: Task) -> None:
    """Replacing a copy by deleting it would stop the Python session and remove the work
    files made since it was stored (what deleting any artifact does): an append must not."""
    history = History(task)
    history.append([{"role": "user", "content": "first"}])
    toolset = Toolset(task)
    assert run(toolset, "python", "kept = 41", session=True)["exit_code"] == 0
    assert run(toolset, "sh", "echo draft > /sandbox/work/notes.txt")["exit_code"] == 0
    history.append([{"role": "assistant", "content": "second"}])
    history.append([{"role": "user", "content": "third"}])
    assert run(toolset, "python", "kept + 1", session=True)["output"].strip() == "42"
    assert run(toolset, "sh", "cat /sandbox/work/notes.txt")["output"].strip() == "draft"
