"""Stateless scripts through the fork server, under runc and gVisor: prepared ahead, yet
nothing of one script reaches the next; the fork server killed by a script; long scripts.
(Every attack test in test_attacks.py runs its scripts through this path too.)"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import test_attacks
from test_attacks import probe

from spillbox import Harness, Task
from spillbox.sandbox.docker import ENGINE_USER, DockerBackend

harness = test_attacks.harness
"""A docker harness, under runc and again under gVisor."""
task = test_attacks.task


def test_a_python_script_starts_prepared_and_as_python3_c_would(task: Task) -> None:
    found = probe(
        task,
        "import json, os, sys\n"
        "print(json.dumps({'preloaded': [m in sys.modules for m in ('duckdb', 'pyarrow', 'jq')],"
        " 'name': __name__, 'argv': sys.argv, 'path0': sys.path[0], 'cwd': os.getcwd(),"
        " 'stdin': sys.stdin.read(), 'pgid_is_pid': os.getpgid(0) == os.getpid()}))",
    )
    assert found == {
        "preloaded": [True, True, True],
        "name": "__main__",
        "argv": ["-c"],
        "path0": "",
        "cwd": "/sandbox/work",
        "stdin": "",
        "pgid_is_pid": True,  # a process group of its own, which its timeout signals whole
    }


def test_nothing_of_one_script_reaches_the_next(task: Task) -> None:
    planted = task.exec(
        "python",
        "import builtins, duckdb, sys\n"
        "builtins.planted = 1\n"
        "duckdb.planted = 1\n"
        "sys.modules['json'] = None\n"
        "duckdb.sql('CREATE TABLE planted AS SELECT 1')",
    )
    assert planted.exit_code == 0, planted.stderr
    found = probe(
        task,
        "import builtins, duckdb, json\n"
        "tables = duckdb.sql('SHOW TABLES').fetchall()\n"
        "print(json.dumps([hasattr(builtins, 'planted'), hasattr(duckdb, 'planted'), tables]))",
    )
    assert found == [False, False, []]


def test_an_sh_script_starts_as_a_shell_would(task: Task) -> None:
    """sh is spawned, not forked from the server: a process group of its own, stdin empty,
    only fds 0-2, and SIGPIPE at its default (ignored in Python), so `yes | head` ends
    quietly."""
    result = task.exec(
        "sh",
        "(cd /proc/$$/fd && echo *); yes | head -n 1; cat; id -u; pwd\n"
        'test "$(ps -o pgid= -p $$)" -eq $$ && echo own-group',
    )
    assert (result.exit_code, result.stderr) == (0, "")
    # The glob runs in a subshell: the folder it reads is open there, not in the script.
    assert result.text == "0 1 2\ny\n10001\n/sandbox/work\nown-group\n"
    nul = task.exec("sh", "echo a\0b")
    assert nul.exit_code == 127 and "cannot start the script" in nul.stderr


def test_the_prepared_duckdb_connection_works_as_a_fresh_one(task: Task) -> None:
    """DuckDB's default connection is made in the fork server before the fork, with no
    thread of its own: in a script it reads and writes files and takes more threads for a
    query over many rows, without hanging."""
    result = task.exec(
        "python",
        "import duckdb, json, pathlib\n"
        "pathlib.Path('rows.json').write_text(json.dumps([{'a': i} for i in range(1000)]))\n"
        "duckdb.sql(\"COPY (SELECT * FROM 'rows.json') TO 'rows.parquet'\")\n"
        "print(duckdb.sql(\"SELECT count(*), sum(a) FROM 'rows.parquet'\").fetchall())\n"
        "duckdb.sql('SET threads = 2')\n"
        "print(duckdb.sql('SELECT sum(range) FROM range(20000000)').fetchall())\n"
        "print(duckdb.sql(\"SELECT current_setting('threads')\").fetchall())",
        timeout=60,
    )
    assert not result.timed_out and result.exit_code == 0, result.stderr
    assert result.text == "[(1000, 499500)]\n[(199999990000000,)]\n[(2,)]\n"


def test_a_python_script_ends_with_its_own_status_not_a_forked_childs(task: Task) -> None:
    """A python script says its exit status as it ends (before its memory is torn down); a
    child it forked that runs off the end of the code first says nothing, and a script
    that ends without saying (os._exit, a crash) is waited for."""
    forked = task.exec(
        "python",
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    print('child', flush=True)\n"
        "else:\n"
        "    os.wait()\n"
        "    time.sleep(0.2)\n"
        "    print('parent')\n"
        "    raise SystemExit(3)",
    )
    assert (forked.exit_code, forked.text) == (3, "child\nparent\n"), forked.stderr
    assert task.exec("python", "import os\nos._exit(5)").exit_code == 5
    assert task.exec("python", "import os\nos.close(1)\nos.close(2)\nexit(4)").exit_code == 4
    crashed = task.exec("python", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert crashed.exit_code == 139


def test_a_script_that_kills_the_fork_server_ends_and_the_next_one_runs(task: Task) -> None:
    result = task.exec(
        "python", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('done')"
    )
    # It prints before a new server starts, or that server kills it first (a new server
    # ends every other process of the scripts' uid, since one may pose as the server):
    # which, depends on timing and the machine's load. Either way it ends, and is killed.
    assert result.text in ("done\n", ""), f"{result.text!r} (timing and load decide which)"
    assert result.exit_code == 137 and not result.timed_out, result
    after = task.exec("python", "print('alive')")
    assert (after.exit_code, after.text) == (0, "alive\n"), after.stderr
    assert task.exec("sh", "echo alive").text == "alive\n"


def test_a_long_script_runs(task: Task) -> None:
    # Over Linux's limit for one command-line argument (128 KB), which a script passed
    # to `docker exec` as an argument could not pass.
    code = "x = 0\n" + "x += 1\n" * 30_000 + "print(x)"
    assert len(code) > 200_000
    result = task.exec("python", code)
    assert (result.exit_code, result.text) == (0, "30000\n"), result.stderr[-500:]


@pytest.mark.parametrize("sandbox_dies", [True, False], ids=["sandbox-dies", "sandbox-lives"])
def test_a_relay_cut_under_its_script_asks_what_became_of_the_sandbox(
    task: Task, harness: Harness, sandbox_dies: bool
) -> None:
    """The relay's output ends without the script's end (killed from outside: no script can,
    it is another uid), then the sandbox stops, or not: reported as what it was, and the
    next script runs (in a restarted sandbox, or through a new relay)."""
    assert isinstance(harness.backend, DockerBackend)
    container = harness.backend.container(task.storage)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            task.exec, "sh", "echo out; touch /sandbox/work/started; sleep 30", timeout=60
        )
        while task.exec("sh", "test -e /sandbox/work/started").exit_code != 0:
            assert not running.done(), running.result()
        cut = container.exec_run(["pkill", "-KILL", "-f", "forkserver.py relay"], user=ENGINE_USER)
        assert cut.exit_code == 0, cut.output
        if sandbox_dies:
            container.kill()
        result = running.result()
    assert result.exit_code == 137 and not result.timed_out and not result.oom_killed
    assert result.text == "out\n"
    assert ("the sandbox stopped while the script ran" in result.stderr) == sandbox_dies
    again = task.exec("sh", "echo again")
    assert (again.exit_code, again.text) == (0, "again\n"), again.stderr
