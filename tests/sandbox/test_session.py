"""The persistent Python session against a real engine, under runc and gVisor: state across
calls, reset, timeouts, crashes, OOM, concurrent calls, isolation; and the sandbox's attack
tests run again with their Python as session cells (and their sh, run from a cell)."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import test_attacks
from test_attacks import MEMORY_HOG, payload, probe

from spillbox import ExecResult, Harness, Task, ToolResult
from spillbox.sandbox.docker import SESSION_UID
from spillbox.tools import Toolset

pytestmark = pytest.mark.docker

harness = test_attacks.harness
"""A docker harness, under runc and again under gVisor."""
task = test_attacks.task


def cell(task: Task, code: str, timeout: float = 20.0, reset: bool = False) -> ExecResult:
    return task.exec("python", code, timeout=timeout, session=True, reset_session=reset)


def ok(task: Task, code: str, timeout: float = 20.0) -> str:
    result = cell(task, code, timeout)
    assert result.exit_code == 0, result.stderr
    return result.text


def test_names_survive_between_calls_and_a_reset_clears_them(task: Task) -> None:
    first = cell(task, "import os\nx = 41\nserver = os.getpid()\nduckdb_id = id(duckdb)")
    assert first.exit_code == 0 and first.stderr == "", first.stderr
    assert ok(task, "x + 1") == "42\n"  # a last expression is printed, as in a notebook
    # The same process and the same duckdb module: imported once, when the session started.
    assert ok(task, "(os.getpid() == server, id(duckdb) == duckdb_id)") == "(True, True)\n"
    assert ok(task, "print(os.getuid())") == f"{SESSION_UID}\n"
    stateless = task.exec("python", "print(x)")
    assert stateless.exit_code == 1 and "NameError" in stateless.stderr
    reset = cell(task, "'x' in dir()", reset=True)
    assert reset.text == "False\n"
    assert "the Python session was reset" in reset.stderr
    assert ok(task, "y = 1") == "" and ok(task, "y") == "1\n"


def test_the_sessions_duckdb_has_the_same_artifact_tables_as_sql(task: Task) -> None:
    task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    query = 'SELECT count(*) AS n, min(id) AS lo, max(id) AS hi FROM "c1"'
    sql = task.exec("sql", query)
    assert sql.text.splitlines() == ["n,lo,hi", "400,0,399"], sql.stderr
    assert ok(task, f"con.sql('{query}').fetchall()") == "[(400, 0, 399)]\n"
    assert ok(task, f"duckdb.sql('{query}').fetchall()") == "[(400, 0, 399)]\n"
    # Kept between calls like any name: a table read once, then filtered in the next call.
    ok(task, "t = con.sql('SELECT * FROM \"c1\"').to_arrow_table()")
    assert ok(task, "t.num_rows, type(t).__module__.split('.')[0]") == "(400, 'pyarrow')\n"


def test_a_timeout_interrupts_the_cell_and_keeps_the_session(task: Task) -> None:
    ok(task, "kept = 'yes'")
    result = cell(task, "import time\nbefore = 1\ntime.sleep(60)\nafter = 1", timeout=2)
    assert result.timed_out and result.exit_code == 124
    assert "KeyboardInterrupt" in result.stderr
    assert "the session is kept" in result.stderr
    assert ok(task, "kept, before, 'after' in dir()") == "('yes', 1, False)\n"
    # A long DuckDB query is interrupted too (the connection, not only the Python code).
    query = "con.sql('SELECT max(hash(a.range, b.range)) FROM range(200000) a, range(200000) b').fetchall()"  # noqa: E501
    stopped = cell(task, query, timeout=2)
    assert stopped.timed_out and "the session is kept" in stopped.stderr, stopped.stderr
    assert ok(task, "kept") == "'yes'\n"


def test_a_cell_that_will_not_stop_ends_its_session_and_the_next_call_is_told(task: Task) -> None:
    ok(task, "kept = 1")
    stubborn = "import time\nwhile True:\n    try:\n        time.sleep(60)\n    except BaseException:\n        pass\n"  # noqa: E501
    result = cell(task, stubborn, timeout=2)
    assert result.timed_out
    assert "the session was ended and its names are gone" in result.stderr, result.stderr
    after = cell(task, "'kept' in dir()")
    assert after.text == "False\n"
    assert "names defined before are gone" in after.stderr


@pytest.mark.parametrize(
    "crash",
    ["import os; os._exit(3)", "import ctypes; ctypes.string_at(0)"],
    ids=["exit", "segfault"],
)
def test_a_crash_ends_the_session_and_the_next_call_is_told(task: Task, crash: str) -> None:
    ok(task, "kept = 1")
    result = cell(task, crash)
    assert result.exit_code == 137 and not result.timed_out and not result.oom_killed
    assert "the Python session ended while this cell ran" in result.stderr
    after = cell(task, "'kept' in dir()")
    assert (after.exit_code, after.text) == (0, "False\n")
    assert "names defined before are gone" in after.stderr


def test_an_oom_in_a_session_is_reported_and_the_next_call_is_told(task: Task) -> None:
    task.admit([ToolResult(call_id="before", tool="t", content=payload("before"))])
    ok(task, "kept = 1")
    result = cell(task, MEMORY_HOG, timeout=60)
    assert "allocated all" not in result.text
    assert result.oom_killed and not result.timed_out, result.stderr
    assert result.exit_code == 137
    after = cell(task, "'kept' in dir()")
    assert (after.exit_code, after.text) == (0, "False\n"), after.stderr
    assert "names defined before are gone" in after.stderr
    assert task.exec("sql", 'SELECT count(*) AS n FROM "before"').text.split() == ["n", "400"]


def test_a_sandbox_killed_between_cells_is_told_at_the_next_cell(
    harness: Harness, task: Task
) -> None:
    ok(task, "kept = 1")
    ok(task, "open('/sandbox/work/f', 'w').write('x')")
    backend: Any = harness.backend
    container = backend.container(task.storage)
    container.kill()
    container.wait()
    after = cell(task, "import os; 'kept' in dir(), os.path.exists('/sandbox/work/f')")
    assert (after.exit_code, after.text) == (0, "(False, False)\n"), after.stderr
    assert "names defined before are gone" in after.stderr
    assert "files in /sandbox/work and /tmp are gone" in after.stderr
    assert cell(task, "kept = 2").stderr == ""


def test_concurrent_calls_into_one_session_run_one_at_a_time(task: Task) -> None:
    ok(task, "events = []")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(
            cell,
            task,
            # The first holds the session until the busy call below has given up (no sleep
            # to race: the cells' own speed no longer decides the order).
            "import os, time\nopen('/sandbox/work/first-started', 'w').close()\n"
            "while not os.path.exists('/sandbox/work/busy-done'):\n    time.sleep(0.01)\n"
            "events.append('first')",
        )
        while task.exec("sh", "test -e /sandbox/work/first-started").exit_code != 0:
            assert not first.done(), first.result().stderr
        # Waits for the first; a call whose whole timeout passes while it waits does not run.
        busy = cell(task, "events.append('busy')", timeout=1)
        assert task.exec("sh", "touch /sandbox/work/busy-done").exit_code == 0
        second = pool.submit(cell, task, "events.append('second')\nevents")
        assert first.result().exit_code == 0
        assert second.result().text == "['first', 'second']\n", second.result().stderr
    assert busy.timed_out and "busy with another call" in busy.stderr, busy.stderr


def test_a_session_in_one_task_cannot_see_another_tasks(harness: Harness) -> None:
    alpha, bravo = harness.task("alpha"), harness.task("bravo")
    try:
        secret = "ALPHA-" + "7" * 20
        ok(alpha, f"secret = {secret!r}")
        found = cell(bravo, "'secret' in dir()")
        assert (found.exit_code, found.text) == (0, "False\n")
        probe_code = f"""
import json, os
hits = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for leaf in ("cmdline", "environ"):
        try:
            if bytes.fromhex({secret.encode().hex()!r}) in open(f"/proc/{{pid}}/{{leaf}}", "rb").read():
                hits.append(pid)
        except OSError:
            pass
print(json.dumps(hits))
"""  # noqa: E501
        assert json.loads(ok(bravo, probe_code)) == []
    finally:
        alpha.close(delete=True)
        bravo.close(delete=True)


SESSION_PROBE = """
import json, os, signal, socket
out = {}
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect("/sandbox/run/python.sock")
    out["connect"] = "connected"
except OSError as e:
    out["connect"] = e.strerror
try:
    out["listing"] = os.listdir("/sandbox/run")
except OSError as e:
    out["listing"] = e.strerror
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            # The needle, hex-encoded: this probe's own command line must not hold it.
            if bytes.fromhex("73657373696f6e2e7079") in open(f"/proc/{name}/cmdline", "rb").read():
                os.kill(int(name), signal.SIGKILL)
                out["kill"] = "killed"
        except OSError as e:
            out["kill"] = e.strerror
print(json.dumps(out))
"""


def test_a_stateless_script_cannot_reach_or_kill_the_session(task: Task) -> None:
    ok(task, "kept = 1")
    found = probe(task, SESSION_PROBE)
    assert found == {
        "connect": "Permission denied",
        "listing": "Permission denied",
        "kill": "Operation not permitted",
    }, found
    assert ok(task, "kept") == "1\n"


SESSION_LEFTOVERS = """
import json, os
left = []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) == os.getpid():
        continue
    try:
        fields = dict(line.split(":", 1) for line in open(f"/proc/{name}/status") if ":" in line)
    except OSError:
        continue
    uid, ppid = int(fields["Uid"].split()[0]), int(fields["PPid"])
    if uid == os.getuid() and ppid != 0 and fields["State"].split()[0] not in "ZX":
        left.append(open(f"/proc/{name}/cmdline", "rb").read().decode(errors="replace"))
print(json.dumps(left))
"""
"""Processes of the session uid but the server (this cell) and the relays Docker entered."""


def test_what_a_cell_starts_in_the_background_is_killed_when_it_ends(task: Task) -> None:
    spawned = cell(
        task,
        "import subprocess\n"
        "subprocess.Popen(['sh', '-c', 'setsid sleep 300 & nohup sleep 301 & sleep 302'])\n"
        "subprocess.Popen(['sleep', '303'], start_new_session=True)\n"
        "print('spawned')",
    )
    assert spawned.text == "spawned\n", spawned.stderr
    assert json.loads(ok(task, SESSION_LEFTOVERS)) == []
    bomb = cell(task, test_attacks.FORK_UNTIL_REFUSED.format(bound=400), timeout=5)
    assert bomb.exit_code != 0
    assert json.loads(ok(task, SESSION_LEFTOVERS)) == []


def test_the_session_runs_unprivileged(task: Task) -> None:
    found = json.loads(
        ok(
            task,
            "import json, os\n"
            "status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines())\n"  # noqa: E501
            "out = {'uid': os.getuid(), 'euid': os.geteuid(), 'groups': os.getgroups(),\n"
            "       'CapEff': status['CapEff'].strip()}\n"
            "for name, act in [('setuid', lambda: os.setuid(0)),\n"
            "                  ('chown', lambda: os.chown('/sandbox/work', 0, 0))]:\n"
            "    try:\n"
            "        act(); out[name] = 'allowed'\n"
            "    except OSError as e:\n"
            "        out[name] = e.strerror\n"
            "print(json.dumps(out))",
        )
    )
    assert found["uid"] == found["euid"] == SESSION_UID
    assert 0 not in found["groups"] and int(found["CapEff"], 16) == 0
    assert found["setuid"] == found["chown"] == "Operation not permitted"


def test_deleting_an_artifact_ends_the_session_that_may_hold_it(task: Task) -> None:
    task.admit([ToolResult(call_id="c1", tool="t", content=payload("MARK"))])
    ok(task, "rows = con.sql('SELECT secret FROM \"c1\" LIMIT 1').fetchall()")
    task.delete("c1")
    after = cell(task, "'rows' in dir()")
    assert after.text == "False\n" and "names defined before are gone" in after.stderr


def test_sandbox_exec_takes_session_per_call_and_per_task(task: Task) -> None:
    stateless = Toolset(task)
    per_task = Toolset(task, python_session=True)

    def run(toolset: Toolset, **args: Any) -> dict[str, Any]:
        output = toolset.call("sandbox_exec", {"lang": "python", **args})
        body: dict[str, Any] = json.loads(output.text)
        return body

    assert run(stateless, code="z = 5", session=True)["exit_code"] == 0
    assert run(per_task, code="z")["output"] == "5\n"
    assert "NameError" in run(stateless, code="print(z)")["stderr"]
    assert run(per_task, code="z", session=False)["exit_code"] == 1
    assert run(stateless, code="'z' in dir()", reset_session=True)["output"] == "False\n"
    refused = stateless.call("sandbox_exec", {"lang": "sh", "code": "true", "session": True})
    assert refused.is_error and "session" in refused.text


SH_IN_A_CELL = (
    "import subprocess, sys\n"
    "sys.exit(subprocess.run(['sh', '-c', {code!r}], stdin=subprocess.DEVNULL).returncode)"
)
"""An sh script run from a session cell: its processes are the session's, its output the
cell's, its exit code the call's."""


class SessionTask:
    """A task whose python runs as cells of its session (and with sh=True its sh scripts
    too, from a cell): the attack tests' own probes, run against the session."""

    scripts_uid = SESSION_UID
    """The uid its scripts run as (test_attacks.scripts_uid)."""

    def __init__(self, task: Task, sh: bool = False) -> None:
        self._task = task
        self._sh = sh

    def exec(self, lang: str, code: str, **kwargs: Any) -> ExecResult:
        if lang == "sh" and self._sh:
            lang, code = "python", SH_IN_A_CELL.format(code=code)
        if lang == "python":
            kwargs["session"] = True
        return self._task.exec(lang, code, **kwargs)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)


class SessionHarness:
    """A harness whose tasks are SessionTasks (for the attacks that make their own)."""

    def __init__(self, harness: Harness) -> None:
        self._harness = harness

    def task(self, task_id: str) -> SessionTask:
        return SessionTask(self._harness.task(task_id))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._harness, name)


ATTACKS: list[Callable[..., None]] = [
    test_attacks.test_network_is_unreachable,
    test_attacks.test_root_filesystem_is_read_only_and_tmp_is_capped,
    test_attacks.test_a_script_cannot_write_past_the_work_cap_nor_onto_the_hosts_disk,
    test_attacks.test_a_script_cannot_kill_init_or_the_sql_engine,
    test_attacks.test_a_script_cannot_reach_or_replace_the_sql_engine,
    test_attacks.test_the_memory_limit_holds_and_the_task_survives,
    test_attacks.test_two_busy_processes_get_one_cpu_between_them,
    test_attacks.test_a_print_flood_is_bounded_and_the_harness_survives,
    test_attacks.test_the_container_exposes_nothing_of_the_host,
    test_attacks.test_scripts_run_unprivileged,
    test_attacks.test_one_task_cannot_reach_another_tasks_payload,
    test_attacks.test_fork_bomb_hits_the_pids_limit_and_the_task_survives,
    test_attacks.test_an_oom_docker_records_after_the_exit_is_still_reported,
    test_attacks.test_a_query_beside_a_memory_hog_is_answered_or_reported_stopped_not_timed_out,
    test_attacks.test_a_process_posing_as_the_runner_does_not_escape_the_sweep,
]

SH_ATTACKS: list[Callable[..., None]] = [
    test_attacks.test_a_script_that_outlives_its_timeout_is_killed_with_its_children,
    test_attacks.test_a_plain_sleep_past_its_timeout_is_killed,
    test_attacks.test_a_detached_child_of_a_finished_script_does_not_outlive_the_exec,
    test_attacks.test_a_program_planted_in_work_does_not_run_even_setuid,
    test_attacks.test_a_script_cannot_write_into_the_container_log,
    test_attacks.test_the_host_never_follows_a_planted_symlink,
]
"""Attacks written in sh: run from a session cell (SH_IN_A_CELL), as a cell's code would."""


@pytest.mark.parametrize(
    ("attack", "sh"),
    [(attack, False) for attack in ATTACKS] + [(attack, True) for attack in SH_ATTACKS],
    ids=[attack.__name__[5:] for attack in ATTACKS + SH_ATTACKS],
)
def test_attack_as_a_session_cell(
    attack: Callable[..., None],
    sh: bool,
    task: Task,
    harness: Harness,
    docker_client: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    given = {
        "task": SessionTask(task, sh=sh),
        "harness": SessionHarness(harness),
        "docker_client": docker_client,
        "monkeypatch": monkeypatch,
        "tmp_path": tmp_path,
    }
    names = attack.__code__.co_varnames[: attack.__code__.co_argcount]
    attack(**{name: given[name] for name in names})
    # Each ran in the session: it is still there (or, after the OOM, told it is new).
    assert cell(task, "1").exit_code == 0
