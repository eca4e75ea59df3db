"""Faults against a real engine: a killed harness, a container removed from outside, a full
disk, deletion that leaves nothing, and (last: it restarts the engine) a daemon restart."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

from conftest import pooled_task
from spillbox import Harness, Policy, StorageError, ToolResult
from spillbox import gc as spillbox_gc
from spillbox.harness import Task
from spillbox.sandbox.docker import LABEL_HOME, LABEL_TASK, cleanup_home
from spillbox.types import ExecRequest

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
ENSURE_DOCKER = REPO / "scripts" / "ensure-docker.sh"


def prs(n: int, tag: str = "pr") -> str:
    rows = [
        {"id": i, "state": "open" if i % 4 else "closed", "title": f"{tag} {i}"} for i in range(n)
    ]
    return json.dumps(rows)


def skip_unless_ci(reason: str) -> None:
    """Skip here; under CI=true (root, a local dockerd) the missing precondition is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def make_harness(home: Path) -> Harness:
    return Harness(sandbox="docker", home=home, gc_interval=-1, policy=Policy(per_call_tokens=200))


@pytest.fixture
def harness(docker_home: Path) -> Iterator[Harness]:
    with make_harness(docker_home) as harness:
        yield harness


def offload(task: Task, call_id: str, content: str) -> None:
    [admitted] = task.admit([ToolResult(call_id=call_id, tool="t", content=content)])
    assert admitted.offloaded, admitted.text


def containers(client: Any, home: Path, task_id: str) -> list[Any]:
    labels = [f"{LABEL_TASK}={task_id}", f"{LABEL_HOME}={home.resolve()}"]
    found: list[Any] = client.containers.list(all=True, filters={"label": labels})
    return found


def count_sql(task: Task, table: str) -> str:
    result = task.exec("sql", f'SELECT count(*) AS n FROM "{table}"')
    assert result.exit_code == 0, result.stderr
    return result.text.splitlines()[1]


_CRASHING_OFFLOAD = """
import os, sys
from pathlib import Path
from spillbox import Harness, Policy, ToolResult
import spillbox.sandbox.storage as storage

class DyingOs:
    # The payload is complete in .incoming; the process dies before linking it into place.
    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def link(src, dst):
        os.kill(os.getpid(), 9)

harness = Harness(sandbox="docker", home=Path(sys.argv[1]), gc_interval=-1,
                  policy=Policy(per_call_tokens=50))
task = harness.task("crash")
task.admit([ToolResult(call_id="c0", tool="t", content=sys.argv[2])])
assert task.exec("sh", "true").exit_code == 0
storage.os = DyingOs()
task.admit([ToolResult(call_id="c1", tool="t", content=sys.argv[3])])
print("not reached", flush=True)
"""


def test_a_harness_killed_mid_offload_leaves_no_half_artifact(docker_home: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CRASHING_OFFLOAD, str(docker_home), prs(50, "a"), prs(300, "b")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert "not reached" not in done.stdout
    with make_harness(docker_home) as harness:
        task = harness.existing("crash")
        assert sorted(p.name for p in task.storage.offload.iterdir()) == ["c0.json"]
        [temp] = list(task.storage.incoming.iterdir())
        assert temp.read_bytes() == prs(300, "b").encode()  # complete, yet never visible
        assert [r.artifact_id for r in task.artifacts(include_deleted=True)] == ["c0"]
        assert harness.catalog.find("crash", "c1") is None
        removed = spillbox_gc.collect(harness, grace=0)
        assert [(r.kind, r.task_id, r.what) for r in removed] == [("temp", "crash", temp.name)]
        assert list(task.storage.incoming.iterdir()) == []
        assert spillbox_gc.collect(harness, grace=0) == []
        assert task.read("c0") == prs(50, "a").encode()


@pytest.mark.parametrize("how", ["removed", "stopped", "stopped-mid-exec"])
def test_a_container_removed_from_outside_is_recreated_with_payloads_intact(
    harness: Harness, docker_client: Any, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = harness.settings.home
    task = harness.task(f"outside-{how}")
    offload(task, "c1", prs(200))
    assert count_sql(task, "c1") == "200"
    [before] = containers(docker_client, home, task.id)
    if how == "removed":
        before.remove(force=True)
    elif how == "stopped":
        before.stop(timeout=1)
    else:
        # PID 1 dies between the exec's create and start, as a gVisor sandbox does a moment
        # after a fork bomb. Docker 20.10 then answered (in CI) 500 "is not running", not
        # the 404 or 409 it gives once the exit is processed; that window is a few ms
        # wide, so the container really dies here and the answer seen in CI is replayed.
        # Only this thread's exec is the script's: the session's start and the tables' load
        # behind the sandbox's run in threads of their own (CI saw one of them take the
        # patched call, and the script then found the container still dying).
        api = harness.backend.client.api  # type: ignore[attr-defined]
        start, script_thread = api.exec_start, threading.get_ident()

        def die_then_start(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != script_thread:
                return start(*args, **kwargs)
            monkeypatch.setattr(api, "exec_start", start)
            before.reload()
            os.kill(before.attrs["State"]["Pid"], signal.SIGKILL)
            while api.inspect_container(before.id)["State"]["Running"]:
                time.sleep(0.01)
            response = requests.Response()
            response.status_code = 500
            raise docker.errors.APIError(
                "500 Server Error",
                response=response,
                explanation=f"Container {before.id} is not running: Exited (137)",
            )

        monkeypatch.setattr(api, "exec_start", die_then_start)
    sh = task.exec("sh", "sha256sum /sandbox/offload/c1.json")
    assert sh.exit_code == 0, sh.stderr
    assert sh.text.split()[0] == task.artifact("c1").sha256
    assert count_sql(task, "c1") == "200"
    [after] = containers(docker_client, home, task.id)
    assert after.status == "running"
    assert (after.id != before.id) == (how == "removed")
    # A connection to the old container's SQL engine must be closed, not dropped: collect
    # now, so that a leaked socket fails this test and not whichever test runs next.
    gc.collect()


def test_a_container_killed_under_a_query_runs_the_query_again_in_a_restarted_one(
    harness: Harness, docker_client: Any
) -> None:
    # Seen here: the engine's output ends, the retry's exec is created while Docker still
    # counts the container as running, and its start answers with plain text ("cannot exec
    # in a stopped state"), which reached the caller as a JSONDecodeError. A query only
    # reads, so it now runs again in the restarted sandbox.
    task = harness.task("killed-under-query")
    offload(task, "c1", prs(50))
    assert count_sql(task, "c1") == "50"
    [before] = containers(docker_client, harness.settings.home, task.id)
    started_at = before.attrs["State"]["StartedAt"]
    killer = threading.Timer(2.0, before.kill)
    killer.start()
    # The query runs twice: cut by the kill, then whole in the restarted sandbox, which on a
    # loaded machine took past the default 30 s (CI, 3 workers on 2 cores): room for both.
    query = "SELECT count(DISTINCT i % 1000003) AS n FROM range(300000000) t(i)"
    result = task.exec("sql", query, timeout=180)
    killer.join()
    assert result.exit_code == 0, f"{result.stderr} (timing: the machine's load decides)"
    assert result.text.split() == ["n", "1000003"]
    [after] = containers(docker_client, harness.settings.home, task.id)
    # The answer came from a restart: the kill landed under the query, not after it.
    assert after.status == "running" and after.attrs["State"]["StartedAt"] != started_at
    assert count_sql(task, "c1") == "50"
    gc.collect()  # as above: a leaked engine socket fails here


_OTHER_PROCESS_CALL = """
import sys
from spillbox import Harness
with Harness(sandbox="docker", home=sys.argv[1], gc_interval=-1) as harness:
    with harness.task(sys.argv[2]) as task:
        result = task.exec("sh", "ls /sandbox/work; echo other")
        sys.stdout.write(result.text)
        sys.stderr.write(result.stderr)
"""


@pytest.mark.parametrize("start", ["cold", "pooled"])
def test_a_call_after_the_sandbox_stopped_says_its_work_files_are_gone(
    harness: Harness, start: str
) -> None:
    # Seen in stop 33: a script run after the task's container was killed answered from a
    # restarted sandbox whose /sandbox/work was empty, exit 0, and nothing said so.
    task = pooled_task(harness, "restarted") if start == "pooled" else harness.task("restarted")
    offload(task, "c1", prs(50))
    first = task.exec("sh", "echo kept > /sandbox/work/f; cat /sandbox/work/f")
    assert (first.text, first.stderr) == ("kept\n", "")

    def kill() -> None:  # the task's container: its own, or the pool slot's it adopted
        container = harness.backend.container(task.storage)  # type: ignore[attr-defined]
        container.kill()
        container.wait()

    kill()
    after = task.exec("sh", "ls /sandbox/work; echo done")
    assert (after.exit_code, after.text) == (0, "done\n"), after.stderr
    assert "files in /sandbox/work and /tmp are gone" in after.stderr
    assert "payloads in /sandbox/offload are intact" in after.stderr
    assert count_sql(task, "c1") == "50"
    assert task.exec("sh", "echo again").stderr == ""  # told once, not at every call

    # A call from another process (the CLI's, say) is told too: the mark is the task's.
    kill()
    other = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS_CALL, str(harness.settings.home), task.id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert other.returncode == 0 and other.stdout == "other\n", other.stderr
    assert "files in /sandbox/work and /tmp are gone" in other.stderr
    # That process saw the restart; this one's next call runs in the same sandbox: no note.
    last = task.exec("sh", "echo last")
    assert (last.text, last.stderr) == ("last\n", "")
    task.close(delete=True)


def test_a_full_disk_is_a_clear_error_and_no_partial_artifact(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_unless_ci("mounting a small tmpfs needs root (CI runs as root)")
    home = tmp_path / "small-home"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(home)], check=True)
    try:
        with make_harness(home) as harness:
            task = harness.task("full")
            offload(task, "small", prs(100))
            with pytest.raises(StorageError) as caught:
                task.admit([ToolResult(call_id="big", tool="t", content=prs(60_000, "x"))])
            message = str(caught.value)
            assert "\n" not in message
            assert "No space left on device" in message and "free disk space" in message
            assert sorted(p.name for p in task.storage.offload.iterdir()) == ["small.json"]
            assert list(task.storage.incoming.iterdir()) == []
            assert harness.catalog.find("full", "big") is None
            assert [r.artifact_id for r in task.artifacts(include_deleted=True)] == ["small"]
            # The space of the failed write was given back: a payload that fits goes in.
            offload(task, "after", prs(100, "after"))
            assert task.read("small") == prs(100).encode()
            task.close(delete=True)
    finally:
        try:
            cleanup_home(home)
        finally:  # even when cleanup fails (no engine): a mount left behind breaks later runs
            umount = subprocess.run(["umount", str(home)], capture_output=True)
            if umount.returncode != 0:
                subprocess.run(["umount", "-l", str(home)], check=True)


def test_deleting_a_task_leaves_no_container_volume_or_folder(
    harness: Harness, docker_client: Any
) -> None:
    home = harness.settings.home
    task = harness.task("doomed")
    offload(task, "c1", prs(200))
    assert count_sql(task, "c1") == "200"
    copy = task.exec("sh", "cp /sandbox/offload/c1.json /sandbox/work/copy.json && echo ok")
    assert copy.text.strip() == "ok", copy.stderr
    [container] = containers(docker_client, home, task.id)
    volumes = [m["Name"] for m in container.attrs["Mounts"] if m["Type"] == "volume"]
    task.close(delete=True)
    assert containers(docker_client, home, task.id) == []
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_TASK}=doomed"}) == []
    assert docker_client.volumes.list(filters={"label": f"{LABEL_TASK}=doomed"}) == []
    remaining = {v.name for v in docker_client.volumes.list()}
    assert not remaining & set(volumes)
    assert not task.storage.root.exists()
    assert not [p for p in (home / "tasks").rglob("*") if "doomed" in p.name]
    row = harness.catalog.task("doomed")
    assert row is not None and row.state == "deleted"
    assert all(a.state == "deleted" for a in task.artifacts(include_deleted=True))


def test_a_deleted_artifact_loses_its_derived_copies_and_a_query_names_the_tombstone(
    harness: Harness,
) -> None:
    task = harness.task("derived")
    offload(task, "c1", prs(200))
    offload(task, "c2", prs(100, "other"))
    assert count_sql(task, "c1") == "200"
    assert count_sql(task, "c2") == "100"
    copy = task.exec(
        "sh",
        "cd /sandbox/offload && cp c1.json /sandbox/work/c1-copy.json && cp c1.json /tmp/ && "
        "jq -c '.[]' c1.json > /sandbox/work/c1.ndjson && echo ok",
    )
    assert copy.text.strip() == "ok", copy.stderr
    task.delete("c1", by="operator")
    assert sorted(p.name for p in task.storage.offload.iterdir()) == ["c2.json"]
    # The copy and the conversion, in the container's own folders (work is its tmpfs).
    left = task.exec("python", "import os; print(os.listdir('/sandbox/work'), os.listdir('/tmp'))")
    assert left.text.strip() == "[] []", left.stderr
    derived = [p for p in task.storage.cache.rglob("*") if p.is_file()]
    assert not [p for p in derived if "c1" in p.name], derived
    gone = task.exec("sql", 'SELECT count(*) FROM "c1"')
    assert gone.exit_code != 0
    row = task.harness.catalog.find("derived", "c1")
    assert row is not None and row.tombstone() in gone.stderr
    assert "by policy operator" in gone.stderr
    assert count_sql(task, "c2") == "100", "the other artifact is still queryable"


def test_gc_reaps_a_container_whose_task_is_unknown(harness: Harness, docker_client: Any) -> None:
    home = harness.settings.home
    ghost = harness.backend.storage("ghost")
    harness.backend.create(ghost)  # storage and a container, but no catalog row
    assert harness.backend.exec(ghost, ExecRequest("sh", "true", timeout=30)).exit_code == 0
    assert len(containers(docker_client, home, "ghost")) == 1
    removed = spillbox_gc.collect(harness, grace=0)
    assert sorted(r.kind for r in removed) == ["container", "storage"]
    assert containers(docker_client, home, "ghost") == []
    assert not ghost.root.exists()
    assert spillbox_gc.collect(harness, grace=0) == []


def _dockerd_pid() -> int | None:
    """The pid of the engine the tests talk to (the default socket's), from its pid file:
    not any dockerd, since another engine on the machine (its own socket) is not ours to
    restart, and ensure-docker.sh would then see a dockerd running and start none."""
    try:
        return int(Path("/var/run/docker.pid").read_text())
    except (OSError, ValueError):
        return None


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def collected_after() -> Iterator[None]:
    """A garbage collection at the end of the test's teardown (after the fixtures asked
    for after this one), while the test's own warning filters still hold."""
    yield
    gc.collect()


# It restarts the engine every other test uses: `make test` runs it alone, after the rest.
# The restart breaks every open connection to the engine; a socket of one of them, never
# closed, is found by the garbage collector at a moment that varies from run to run (the
# test failed on it at some commits of stop 30 and passed at others; at stop 41 once in
# four runs, collected in pytest's terminal summary, where no test's filter holds): that
# is not what this test checks, so its unraisable-exception warning is not an error here,
# and the collection is made to come within the test (collected_after).
@pytest.mark.serial
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_daemon_restart_during_a_task_leaves_payloads_intact(
    collected_after: None, harness: Harness, docker_client: Any
) -> None:
    if os.geteuid() != 0:
        skip_unless_ci("restarting dockerd needs root (CI runs as root)")
    pid = _dockerd_pid()
    if pid is None:
        skip_unless_ci("the engine is not a local dockerd that this test may restart")
    running = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True)
    if len(running.stdout.split()) > 1:
        # ensure-docker.sh starts dockerd only when none runs: this one would stay down.
        skip_unless_ci("another dockerd runs on this machine: a restart here would not return")
    task = harness.task("restart")
    offload(task, "c1", prs(200))
    assert count_sql(task, "c1") == "200"
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(pid), "dockerd did not exit within 60 s"
        subprocess.run([str(ENSURE_DOCKER)], check=True, timeout=120)
        assert count_sql(task, "c1") == "200"
        sh = task.exec("sh", "sha256sum /sandbox/offload/c1.json")
        assert sh.exit_code == 0, sh.stderr
        assert sh.text.split()[0] == task.artifact("c1").sha256
        assert task.read("c1") == prs(200).encode()
        assert docker_client.ping(), "the session's client (later test files) still works"
    finally:
        subprocess.run([str(ENSURE_DOCKER)], check=True, timeout=120)
