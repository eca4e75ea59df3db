"""The Docker backend and code mode against a real engine."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from spillbox import Harness, ToolResult, parse_notice
from spillbox.sandbox.docker import LABEL_HOME, LABEL_TASK

pytestmark = pytest.mark.docker


def prs(n: int) -> str:
    rows = [
        {"id": i, "state": "open" if i % 3 else "closed", "title": f"PR {i}", "body": "x" * 300}
        for i in range(n)
    ]
    return json.dumps(rows, indent=2)


@pytest.fixture
def harness(docker_home: Path) -> Iterator[Harness]:
    with Harness(sandbox="docker", home=docker_home) as harness:
        yield harness


def test_offload_is_visible_in_the_sandbox_and_queryable_by_sql(harness: Harness) -> None:
    with harness.task("q1") as task:
        [admitted] = task.admit([ToolResult(call_id="c1", tool="list_prs", content=prs(400))])
        assert admitted.offloaded and admitted.artifact is not None
        assert admitted.artifact.path == "/sandbox/offload/c1.json"
        result = task.exec(
            "sql", 'SELECT state, count(*) AS n FROM "c1" GROUP BY state ORDER BY state'
        )
        assert result.exit_code == 0, result.stderr
        assert result.text.splitlines() == ["state,n", "closed,134", "open,266"]
        again = task.exec("sql", 'SELECT count(*) FROM "c1"')
        assert again.text.splitlines()[1] == "400"


def test_a_query_is_logged_for_the_artifacts_its_script_names_and_those_only(
    harness: Harness,
) -> None:
    with harness.task("q-log") as task:
        for n, call_id in enumerate(("c1", "c2", "c3")):
            task.admit([ToolResult(call_id=call_id, tool="list_prs", content=prs(400 + n))])
        assert task.exec("sql", 'SELECT count(*) FROM "c1"').exit_code == 0
        assert task.exec("sh", "wc -c /sandbox/offload/c3.json").exit_code == 0
        queries = [
            (entry.artifact_id, entry.actor)
            for entry in harness.catalog.audit("q-log")
            if entry.action == "query"
        ]
        assert queries == [("c1", "sandbox_exec.sql"), ("c3", "sandbox_exec.sh")]


def test_every_hint_in_a_notice_runs(harness: Harness) -> None:
    payloads = {
        "arr": prs(300),
        "nd": "\n".join(json.dumps({"k": i, "v": "y" * 200}) for i in range(400)),
        "tab": "a,b\n" + "\n".join(f"{i},{'z' * 100}" for i in range(800)),
        "log": "\n".join(f"line {i} ok" if i % 97 else f"line {i} ERROR boom" for i in range(6000)),
        "obj": json.dumps({"data": json.loads(prs(300)), "meta": {"page": 1}}),
        "bin": bytes(range(256)) * 10,
    }
    with harness.task("hints") as task:
        admitted = task.admit(
            [ToolResult(call_id=k, tool="t", content=v) for k, v in payloads.items()]
        )
        for item in admitted:
            fields = parse_notice(item.text)
            assert fields is not None, item.call_id
            hints = fields.get("hint", "").splitlines()
            assert hints, f"{item.call_id} has no hint"
            for hint in hints:
                lang, _, code = hint.partition(": ")
                result = task.exec(lang, code)  # type: ignore[arg-type]
                assert result.exit_code == 0, (item.call_id, hint, result.stderr)
                assert result.text.strip(), (item.call_id, hint)


def test_jq_python_and_sh(harness: Harness) -> None:
    with harness.task("langs") as task:
        task.admit([ToolResult(call_id="c1", tool="list_prs", content=prs(300))])
        jq = task.exec("jq", '[.[] | select(.state == "closed")] | length', artifact="c1")
        assert jq.text.strip() == "100"
        py = task.exec(
            "python",
            "import duckdb, pyarrow, jq\n"
            "sql = \"SELECT max(id) FROM read_json_auto('/sandbox/offload/c1.json')\"\n"
            "print(duckdb.sql(sql).fetchall()[0][0])",
        )
        assert py.exit_code == 0, py.stderr
        assert py.text.strip() == "299"
        sh = task.exec("sh", "echo scratch > /sandbox/work/f && cat /sandbox/work/f; id -u")
        assert sh.text.split() == ["scratch", "10001"]
        failing = task.exec("python", "raise SystemExit('bad input: fix it')")
        assert failing.exit_code == 1 and "bad input" in failing.stderr


def test_large_output_becomes_an_artifact_and_reading_it_back_does_not_loop(
    harness: Harness,
) -> None:
    with harness.task("big") as task:
        [admitted] = task.admit([ToolResult(call_id="c1", tool="list_prs", content=prs(400))])
        out = task.exec("sh", "cat /sandbox/offload/c1.json")
        assert out.offloaded and out.artifact is not None
        # The same bytes printed back point at the stored payload: no new copy, no loop.
        assert out.artifact.name == "c1.json"
        assert [row.name for row in task.artifacts()] == ["c1.json"]
        generated = task.exec("python", "print('word ' * 50000)")
        assert generated.offloaded and generated.artifact is not None
        assert generated.artifact.name.startswith("exec-python")
        assert parse_notice(generated.text) is not None
        assert admitted.artifact is not None


def test_timeout_kills_the_whole_process_group(harness: Harness) -> None:
    with harness.task("slow") as task:
        result = task.exec("sh", "sleep 300 & sleep 301 & wait", timeout=1)
        assert result.timed_out
        ps = task.exec("sh", "ps -eo user:12,args")
        assert "sleep 30" not in ps.text, ps.text


def test_a_timeout_kills_only_its_own_script_not_a_concurrent_one(harness: Harness) -> None:
    # Parallel tool calls of one step run scripts side by side in the task's sandbox: the
    # one that times out is killed, and what it left behind, but not its neighbour.
    with harness.task("pair") as task, ThreadPoolExecutor(2) as pool:
        steady = pool.submit(task.exec, "sh", "sleep 4; echo steady done", timeout=30)
        time.sleep(0.5)
        slow = pool.submit(task.exec, "sh", "sleep 300 & sleep 301 & wait", timeout=1)
        assert slow.result().timed_out
        done = steady.result()
        assert (done.exit_code, done.text.strip(), done.timed_out) == (0, "steady done", False)
        ps = task.exec("sh", "ps -eo user:12,args")
        assert "sleep 30" not in ps.text, ps.text


def test_sql_timeout_interrupts_the_query(harness: Harness) -> None:
    with harness.task("slowsql") as task:
        slow = task.exec(
            "sql", "SELECT count(*) FROM range(100000000000) a, range(100000) b", timeout=1
        )
        assert slow.timed_out and slow.exit_code != 0
        assert task.exec("sql", "SELECT 42 AS x").text.splitlines() == ["x", "42"]


def test_a_restarted_harness_reattaches_and_a_removed_container_is_recreated(
    docker_home: Path, docker_client: object
) -> None:
    first = Harness(sandbox="docker", home=docker_home)
    task = first.task("re")
    task.admit([ToolResult(call_id="c1", tool="list_prs", content=prs(300))])
    container = first.backend.container(task.storage)  # type: ignore[attr-defined]

    second = Harness(sandbox="docker", home=docker_home)
    task2 = second.task("re")
    assert second.backend.container(task2.storage).id == container.id  # type: ignore[attr-defined]
    assert "re" in second.tasks()

    container.remove(force=True)
    result = task2.exec("sql", 'SELECT count(*) AS n FROM "c1"')
    assert result.text.splitlines() == ["n", "300"]
    task2.close(delete=True)
    first.close()
    second.close()


def test_the_last_close_stops_the_container_and_lets_go_of_the_sandbox(
    harness: Harness, docker_client: object
) -> None:
    task = harness.task("closed")
    task.admit([ToolResult(call_id="c1", tool="list_prs", content=prs(300))])
    assert task.exec("sh", "echo hi > /sandbox/work/scratch").exit_code == 0
    container = harness.backend.container(task.storage)  # type: ignore[attr-defined]
    other = harness.task("closed")  # a second Task object of the same task
    task.close()
    container.reload()
    assert container.status == "running"  # still open through `other`
    other.close()
    container.reload()
    assert container.status == "exited"
    assert "closed" not in harness.backend._sandboxes  # type: ignore[attr-defined]
    assert harness.catalog.task("closed").state == "closed"  # type: ignore[union-attr]
    with harness.task("closed") as again:  # opened again: its container starts
        result = again.exec("sql", 'SELECT count(*) AS n FROM "c1"')
        assert result.text.splitlines() == ["n", "300"], result.stderr
        assert again.exec("sh", "test -e /sandbox/work/scratch").exit_code == 1
        assert harness.backend.container(again.storage).id == container.id  # type: ignore[attr-defined]


def test_close_with_delete_removes_container_and_storage(
    harness: Harness, docker_client: object
) -> None:
    task = harness.task("gone")
    task.admit([ToolResult(call_id="c1", tool="list_prs", content=prs(300))])
    task.exec("sql", 'SELECT count(*) FROM "c1"')  # leaves a cached table behind
    root = task.storage.root
    task.close(delete=True)
    assert not root.exists()
    left = docker_client.containers.list(  # type: ignore[attr-defined]
        all=True,
        filters={
            "label": [f"{LABEL_TASK}=gone", f"{LABEL_HOME}={harness.settings.home.resolve()}"]
        },
    )
    assert left == []


def test_cli_exec_json_and_tasks(docker_home: Path) -> None:
    payload = docker_home.parent / "prs.json"
    payload.write_text(prs(300))
    cli = [sys.executable, "-m", "spillbox.cli"]
    base = ["--home", str(docker_home)]
    offload = subprocess.run(
        [*cli, "offload", "--task", "cli", *base, "--json", str(payload)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(offload.stdout)["path"] == "/sandbox/offload/prs.json"  # its own name
    run = subprocess.run(
        [*cli, "exec", "--task", "cli", *base, "--lang", "sql", "--json", "-"],
        input='SELECT count(*) AS n FROM "prs"',  # the table is the file's stem
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(run.stdout)
    assert set(out) == {  # the keys of the sandbox_exec tool's result: one set everywhere
        "exit_code",
        "output",
        "stderr",
        "offloaded",
        "path",
        "timed_out",
        "oom_killed",
        "files",
        "file_notes",
    }
    assert out["output"].splitlines() == ["n", "300"]
    assert out["files"] == [] and out["file_notes"] == []
    tasks = subprocess.run(
        [*cli, "tasks", *base, "--json"], capture_output=True, text=True, check=True
    )
    assert "cli" in [row["task"] for row in json.loads(tasks.stdout)]
    subprocess.run([*cli, "rm", "cli", *base], check=True, capture_output=True)


def test_deleting_an_artifact_deletes_its_copies_in_the_sandboxs_writable_folders(
    harness: Harness,
) -> None:
    """/sandbox/work and /tmp live in the container (tmpfs): a deleted payload's copies and
    conversions there go, from inside, and older scratch stays (README, Retention)."""
    with harness.task("derived-inside") as task:
        kept = task.exec("sh", "echo older > /sandbox/work/older.txt")
        assert kept.exit_code == 0, kept.stderr
        # Deletion takes what changed since the payload's creation less a second of clock
        # slack (storage.CLOCK_SLACK_SECONDS): older scratch is older than that.
        time.sleep(2)
        task.admit([ToolResult(call_id="c1", tool="list_prs", content=prs(300))])
        made = task.exec(
            "sh",
            "cp /sandbox/offload/c1.json /sandbox/work/copy.json && mkdir /sandbox/work/sub && "
            "jq -c '.[]' /sandbox/offload/c1.json > /sandbox/work/sub/c1.ndjson && "
            "cp /sandbox/offload/c1.json /tmp/c1.json && echo ok",
        )
        assert made.text.strip() == "ok", made.stderr
        task.delete("c1")
        left = task.exec("sh", "cd /sandbox/work && find . /tmp -mindepth 1 | sort")
        assert left.text.split() == ["./older.txt"], left.text
        task.close(delete=True)
