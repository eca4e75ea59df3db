"""Many processes on one task: one SQL engine per sandbox that every process talks to, and
garbage collection that never removes the sandbox of a task that is open or being opened."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker.models.containers
import pytest

from spillbox import Harness, ToolResult
from spillbox.sandbox.docker import LABEL_HOME, LABEL_TASK

pytestmark = pytest.mark.docker

SPILLBOX = str(Path(sys.executable).with_name("spillbox"))

WORKER = """
import json, sys
from spillbox import Harness, ToolResult

home, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
errors = []
with Harness(sandbox="docker", home=home) as harness:
    task = harness.task("shared")
    for i in range(count):
        rows = [{"id": j, "who": name, "i": i} for j in range(400 + i)]
        call_id = f"{name}-{i}"
        [admitted] = task.admit([ToolResult(call_id=call_id, tool="t", content=json.dumps(rows))])
        if not admitted.offloaded:
            errors.append(f"{call_id} was not offloaded")
        for sql, want in (
            (f'SELECT count(*) AS n FROM "{call_id}" WHERE who = \\'{name}\\'', 400 + i),
            (f'SELECT count(*) AS n FROM "{name}-0"', 400),
        ):
            result = task.exec("sql", sql, timeout=60)
            got = result.text.split()
            if result.exit_code != 0 or got != ["n", str(want)]:
                errors.append(f"{sql}: exit {result.exit_code}, {got}, {result.stderr}")
    task.close()
print(json.dumps(errors))
"""


def rows_json(n: int, **extra: Any) -> str:
    return json.dumps([{"id": i, "title": f"PR {i}", **extra} for i in range(n)])


def engine_processes(harness: Harness, task_id: str) -> list[str]:
    """The command lines of the SQL engines (not relays) running in the task's container."""
    client = docker.from_env()
    try:
        [container] = client.containers.list(
            filters={"label": [f"{LABEL_TASK}={task_id}", f"{LABEL_HOME}={harness.settings.home}"]}
        )
        out = container.exec_run(["pgrep", "-a", "-f", "sqlserver.py serve"]).output
    finally:
        client.close()
    return [line for line in out.decode().splitlines() if "pgrep" not in line]


def test_four_processes_admit_and_query_one_task_at_once(docker_home: Path) -> None:
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(docker_home), name, "10"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in "abcd"
    ]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err
        assert json.loads(out) == [], err
    with Harness(sandbox="docker", home=docker_home) as harness:
        task = harness.task("shared")
        assert len(task.artifacts()) == 40
        result = task.exec("sql", 'SELECT count(*) AS n FROM "d-9"')
        assert result.text.split() == ["n", "409"]
        # Every process spoke to the one engine of the sandbox: each artifact was loaded
        # once, by it, not once per process.
        assert len(engine_processes(harness, "shared")) == 1
        task.close(delete=True)


def test_reopening_a_task_the_cli_just_closed_is_safe_against_collection(
    docker_home: Path, tmp_path: Path
) -> None:
    """Reproduction B: `spillbox offload` closes the task when it exits; a new harness (whose
    collector runs at once) re-opens it and queries, again and again."""
    big = tmp_path / "big.json"
    big.write_text(rows_json(3000))
    for round_ in range(3):
        subprocess.run(
            [SPILLBOX, "offload", "--home", str(docker_home), "--task", "T", str(big)],
            check=True,
            capture_output=True,
        )
        with Harness(sandbox="docker", home=docker_home) as harness:
            task = harness.task("T")
            [row] = task.artifacts()
            result = task.exec("sql", f'SELECT count(*) AS n FROM "{row.artifact_id}"')
            assert (result.exit_code, result.text.split()) == (0, ["n", "3000"]), (
                round_,
                result.stderr,
            )
            task.close()


COLLECT_FOREVER = """
import sys, time
from spillbox import Harness
with Harness(sandbox="docker", home=sys.argv[1], gc_interval=-1) as harness:
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:
        harness.gc()
"""


def test_collection_in_another_process_never_removes_the_container_of_an_open_task(
    docker_home: Path,
) -> None:
    with Harness(sandbox="docker", home=docker_home, gc_interval=-1) as harness:
        with harness.task("T") as task:
            task.admit([ToolResult(call_id="big", tool="t", content=rows_json(3000))])
            assert task.exec("sql", 'SELECT count(*) FROM "big"').exit_code == 0
        collector = subprocess.Popen(
            [sys.executable, "-c", COLLECT_FOREVER, str(docker_home), "25"],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            rounds = 0
            while collector.poll() is None and rounds < 12:
                rounds += 1
                task = harness.task("T")
                for lang, code in (("sql", 'SELECT count(*) AS n FROM "big"'), ("sh", "echo ok")):
                    result = task.exec(lang, code)  # type: ignore[arg-type]
                    assert result.exit_code == 0, (rounds, lang, result.stderr)
                task.close()
        finally:
            collector.kill()
            _, err = collector.communicate()
        assert rounds >= 3, err
        assert "Traceback" not in err, err


def test_the_last_process_to_close_a_task_applies_keep_after_close(docker_home: Path) -> None:
    from spillbox import Retention

    policy = Retention(keep_after_close=0)
    with (
        Harness(sandbox="docker", home=docker_home, gc_interval=-1) as one,
        Harness(sandbox="docker", home=docker_home, gc_interval=-1) as two,
    ):
        first, second = one.task("T", retention=policy), two.task("T", retention=policy)
        first.admit([ToolResult(call_id="big", tool="t", content=rows_json(3000))])
        first.close()  # keep_after_close=0, but `second` still has it open: nothing goes
        result = second.exec("sql", 'SELECT count(*) AS n FROM "big"')
        assert result.text.split() == ["n", "3000"], result.stderr
        assert one.gc() == []
        second.close()  # the last: now the policy deletes it
        assert "T" not in one.tasks()
        assert not (docker_home / "tasks").exists() or not any((docker_home / "tasks").iterdir())


def test_a_container_removed_just_as_it_is_started_is_replaced(
    docker_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Harness(sandbox="docker", home=docker_home, gc_interval=-1) as harness:
        with harness.task("T") as task:
            task.admit([ToolResult(call_id="big", tool="t", content=rows_json(3000))])
            assert task.exec("sh", "true").exit_code == 0
        original = docker.models.containers.Container.start

        removed: list[str] = []

        def removed_first(self: Any, **kwargs: Any) -> Any:
            if not removed:  # what a collector in another process did a moment ago
                removed.append(self.id)
                self.remove(force=True)
            return original(self, **kwargs)

        # The closed task's container is stopped, so that re-opening must start it.
        docker.from_env().containers.list(all=True, filters={"label": f"{LABEL_TASK}=T"})[0].stop(
            timeout=0
        )
        monkeypatch.setattr(docker.models.containers.Container, "start", removed_first)
        task = harness.task("T")
        result = task.exec("sql", 'SELECT count(*) AS n FROM "big"')
        assert (result.exit_code, result.text.split()) == (0, ["n", "3000"]), result.stderr
        assert removed, "the container was not started again: this test proves nothing"
        task.close(delete=True)


@pytest.fixture
def task_with_tables(docker_home: Path) -> Iterator[Any]:
    with Harness(sandbox="docker", home=docker_home, gc_interval=-1) as harness:
        task = harness.task("paths")
        rows = [{"id": i, "title": f"PR {i} {'cache' if i % 7 == 0 else 'x'}"} for i in range(2000)]
        task.admit(
            [
                ToolResult(call_id="prs", tool="t", content=json.dumps(rows)),
                ToolResult(call_id="nd", tool="t", content="\n".join(json.dumps(r) for r in rows)),
                ToolResult(
                    call_id="tab",
                    tool="t",
                    content="id,title\n" + "".join(f"{r['id']},{r['title']}\n" for r in rows),
                ),
            ]
        )
        yield task
        task.close(delete=True)


PATH_FORMS = {
    '"prs"': [
        "read_json_auto('/sandbox/offload/prs.json')",
        "read_json('/sandbox/offload/prs.json')",
        "read_json_auto('/sandbox/offload/prs.json', maximum_object_size=100000000)",
        "'/sandbox/offload/prs.json'",
        "(SELECT * FROM read_json_auto('/sandbox/offload/prs.json'))",
    ],
    '"nd"': [
        "read_ndjson_auto('/sandbox/offload/nd.ndjson')",
        "read_ndjson('/sandbox/offload/nd.ndjson')",
        "read_json_auto('/sandbox/offload/nd.ndjson')",
        "'/sandbox/offload/nd.ndjson'",
    ],
    '"tab"': [
        "read_csv_auto('/sandbox/offload/tab.csv')",
        "read_csv('/sandbox/offload/tab.csv')",
        "'/sandbox/offload/tab.csv'",
    ],
}


def test_a_query_by_path_answers_from_the_artifact_table(task_with_tables: Any) -> None:
    task = task_with_tables
    query = "SELECT count(*) AS n, max(p.id) AS top FROM {} p WHERE p.title LIKE '%cache%'"
    for table, forms in PATH_FORMS.items():
        want = task.exec("sql", query.format(table))
        assert want.exit_code == 0 and want.text.split() == ["n,top", "286,1995"], want.stderr
        for form in forms:
            got = task.exec("sql", query.format(form))
            assert (got.exit_code, got.text) == (0, want.text), (form, got.stderr)
    # The path form reads the loaded table, not the file: with the file unreadable to the
    # engine it answers all the same.
    payload = task.storage.offload / "prs.json"
    mode = payload.stat().st_mode
    payload.chmod(0)
    try:
        got = task.exec("sql", query.format(PATH_FORMS['"prs"'][0]))
        assert got.text.split() == ["n,top", "286,1995"], got.stderr
        unqualified = task.exec(
            "sql", "SELECT count(*) FROM read_json_auto('/sandbox/offload/prs.json')"
        )
        assert unqualified.text.split()[-1] == "2000", unqualified.stderr
    finally:
        payload.chmod(mode)


def test_a_read_with_options_that_change_the_rows_is_run_as_written(task_with_tables: Any) -> None:
    task = task_with_tables
    as_written = task.exec(
        "sql", "SELECT count(*) AS n FROM read_csv('/sandbox/offload/tab.csv', header=false)"
    )
    assert as_written.text.split() == ["n", "2001"], as_written.stderr  # the header is a row


WRITES = [
    'DROP TABLE "prs"',
    'DROP TABLE IF EXISTS "prs"; SELECT 1',
    'SELECT 1; DROP TABLE "prs"',
    'CREATE TABLE "prs2" AS SELECT 1',
    'CREATE OR REPLACE TABLE "prs" AS SELECT 1 AS id',
    'CREATE TEMP TABLE "prs" AS SELECT 1 AS id',
    'CREATE VIEW "prs" AS SELECT 1 AS id',
    "CREATE MACRO prs() AS 1",
    'DELETE FROM "prs"',
    "UPDATE \"prs\" SET title = 'x'",
    'INSERT INTO "prs" SELECT * FROM "prs"',
    'ALTER TABLE "prs" RENAME TO gone',
    'ALTER TABLE "prs" DROP COLUMN title',
    'BEGIN; DROP TABLE "prs"; COMMIT',
    'PREPARE p AS DELETE FROM "prs"',
    'EXPLAIN ANALYZE DELETE FROM "prs"',
    'explain   analyze DROP TABLE "prs"',
    "ATTACH ':memory:' AS other",
    "USE memory",
    "SET search_path = 'nowhere'",
]
"""Statements that can only write: refused with a clear error."""

HIDDEN_WRITES = [
    'WITH gone AS (DELETE FROM "prs" RETURNING *) SELECT count(*) FROM gone',
    "WITH changed AS (UPDATE \"prs\" SET title = 'x' RETURNING *) SELECT count(*) FROM changed",
    "COPY \"prs\" FROM '/sandbox/offload/prs.json'",
]
"""Writes a statement's kind does not show: they run, and change nothing."""


def test_sql_cannot_change_or_drop_an_artifact_table(task_with_tables: Any) -> None:
    task = task_with_tables
    check = 'SELECT count(*) AS n, count(DISTINCT title) AS titles, sum(id) AS s FROM "prs"'
    before = task.exec("sql", check)
    assert before.text.split() == ["n,titles,s", "2000,2000,1999000"], before.stderr
    for sql in WRITES:
        result = task.exec("sql", sql)
        assert result.exit_code != 0, sql
        if not sql.startswith(("SET", "USE")):
            assert "refused" in result.stderr, (sql, result.stderr)
        assert task.exec("sql", check).text == before.text, sql
    for sql in HIDDEN_WRITES:
        task.exec("sql", sql)
        assert task.exec("sql", check).text == before.text, sql
    # A query that runs twice (the host retries one whose engine died) has no effect
    # either time; and an exported query result is a file, which is what COPY is for.
    exported = task.exec("sql", "COPY (SELECT id FROM \"prs\" LIMIT 3) TO '/sandbox/work/x.csv'")
    assert exported.exit_code == 0, exported.stderr
    assert task.exec("sh", "cat /sandbox/work/x.csv").text.split() == ["id", "0", "1", "2"]


LONG_QUERY = 'SELECT max(hash(a.id, b.id, c.id)) FROM "big" a, "big" b, "big" c'
"""27 billion rows over three copies of a 3,000-row artifact: minutes, unless interrupted."""


def test_a_process_killed_mid_query_leaves_the_task_usable(docker_home: Path) -> None:
    with Harness(sandbox="docker", home=docker_home, gc_interval=-1) as harness:
        task = harness.task("T")
        task.admit([ToolResult(call_id="big", tool="t", content=rows_json(3000))])
        assert task.exec("sql", 'SELECT count(*) FROM "big"').exit_code == 0
        slow = (
            "import sys\nfrom spillbox import Harness\n"
            "h = Harness(sandbox='docker', home=sys.argv[1], gc_interval=-1)\n"
            "print('started', flush=True)\n"
            f"h.task('T').exec('sql', {LONG_QUERY!r}, timeout=120)\n"
        )
        victim = subprocess.Popen(
            [sys.executable, "-c", slow, str(docker_home)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert victim.stdout is not None and victim.stdout.readline() == "started\n"
            time.sleep(3)  # its query is running in the engine
        finally:
            victim.kill()
            victim.communicate()
        result = task.exec("sql", 'SELECT count(*) AS n FROM "big"', timeout=60)
        assert (result.exit_code, result.text.split()) == (0, ["n", "3000"]), result.stderr
        task.close(delete=True)


def test_one_process_does_not_wait_for_another_process_s_long_query(docker_home: Path) -> None:
    with (
        Harness(sandbox="docker", home=docker_home, gc_interval=-1) as one,
        Harness(sandbox="docker", home=docker_home, gc_interval=-1) as two,
    ):
        task, other = one.task("T"), two.task("T")
        task.admit([ToolResult(call_id="big", tool="t", content=rows_json(3000))])
        assert other.exec("sql", 'SELECT count(*) FROM "big"').exit_code == 0
        with ThreadPoolExecutor(1) as pool:
            started = threading.Event()

            def run_long() -> Any:
                started.set()
                return task.exec("sql", LONG_QUERY, timeout=20)

            pending = pool.submit(run_long)
            started.wait()
            time.sleep(1)
            quick = other.exec("sql", 'SELECT count(*) AS n FROM "big"')
            assert quick.text.split() == ["n", "3000"], quick.stderr
            assert not pending.done(), "the long query ended first: this test proves nothing"
            assert pending.result().timed_out
        task.close(delete=True)
