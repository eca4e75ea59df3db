"""The Python session's kept channel (channels.SessionChannel: one relay exec kept between
cells) against a real engine, under runc and gVisor: the session made ready before the first
cell, the relay killed mid-cell, a cell after the session crashed, two tasks' sessions apart,
and no cell able to forge the relay's frames."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import GVISOR, runtime_or_skip
from spillbox import ExecResult, Harness, Task
from spillbox.errors import ExecError
from spillbox.sandbox.docker import SESSION_UID, DockerBackend, SandboxOptions, cleanup_home
from spillbox.sandbox.docker.layout import SESSION_USER
from spillbox.sandbox.docker.scripts import CUT_NOTE

pytestmark = pytest.mark.docker

RELAYS = f"""
import json, os
found = []
for name in os.listdir("/proc"):
    try:
        with open(f"/proc/{{name}}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        with open(f"/proc/{{name}}/cmdline", "rb") as f:
            command = f.read().split(b"\\0")
    except (OSError, ValueError):
        continue
    if int(fields["Uid"].split()[0]) == {SESSION_UID} and b"relay" in command:
        found.append(int(name))
"""
"""Sets `found`: the pids of the session's relays (the session uid's processes that Docker
entered with `session.py relay`)."""


@pytest.fixture(scope="module", params=[None, GVISOR], ids=["runc", "gvisor"])
def harness(
    request: pytest.FixtureRequest, docker_client: Any, sandbox_image: str, tmp_path_factory: Any
) -> Iterator[Harness]:
    """One docker harness per runtime, shared by the module's tests (each makes its tasks)."""
    runtime = runtime_or_skip(docker_client, request.param)
    home: Path = tmp_path_factory.mktemp("session-channel")
    options = SandboxOptions(runtime=runtime)
    with Harness(sandbox="docker", home=home, options=options) as harness:
        yield harness
    cleanup_home(home)


@pytest.fixture(scope="module")
def task(harness: Harness) -> Iterator[Task]:
    task = harness.task("kept")
    yield task
    task.close(delete=True)


def cell(task: Task, code: str, timeout: float = 20.0) -> ExecResult:
    return task.exec("python", code, timeout=timeout, session=True)


def ok(task: Task, code: str) -> str:
    result = cell(task, code)
    assert result.exit_code == 0, result.stderr
    return result.text


def prepared(task: Task) -> None:
    """Wait until the session's start behind the sandbox's start is over (it takes an idle
    channel while it runs, so a cell meanwhile opens another)."""
    backend = task.harness.backend
    assert isinstance(backend, DockerBackend)
    sandbox = backend.sandbox(backend.storage(task.id))
    sandbox.warm().join()
    if sandbox._preparing is not None:
        sandbox._preparing.join()


def relays(task: Task) -> list[int]:
    prepared(task)
    found: list[int] = json.loads(ok(task, RELAYS + "print(json.dumps(found))"))
    return found


def test_the_session_is_ready_before_the_first_cell(harness: Harness) -> None:
    task = harness.task("ready")
    try:
        backend = harness.backend
        assert isinstance(backend, DockerBackend)
        storage = backend.storage(task.id)
        sandbox = backend.sandbox(storage)
        sandbox.warm().join()
        preparing = sandbox._preparing
        assert preparing is not None
        preparing.join()
        container = backend.container(storage)
        ran = container.exec_run(["cat", "/sandbox/run/python.pid"], user=SESSION_USER)
        assert ran.exit_code == 0, ran.output
        server = int(ran.output)
        first = cell(task, "import os\nos.getpid()")
        assert (first.exit_code, first.stderr) == (0, "")
        assert int(first.text) == server  # the cell ran in the session prepared before it
    finally:
        task.close(delete=True)


def test_cells_one_after_another_keep_their_relay(task: Task) -> None:
    before = relays(task)
    for _ in range(3):
        ok(task, "1")
    assert relays(task) == before  # no relay per cell


def test_a_cell_that_kills_its_relay_mid_cell_is_reported_and_the_session_goes_on(
    task: Task,
) -> None:
    ok(task, "kept_name = 41")
    killed = cell(
        task,
        RELAYS
        + "for pid in found:\n    os.kill(pid, 9)\nimport time\ntime.sleep(5)\nprint('after')",
    )
    assert killed.exit_code == 137 and not killed.timed_out, killed
    assert CUT_NOTE.decode() in killed.stderr
    assert "after" not in killed.text
    after = cell(task, "kept_name + 1")
    assert (after.exit_code, after.text, after.stderr) == (0, "42\n", "")
    assert relays(task) == relays(task)  # a new relay, kept again


def test_a_cell_after_the_session_crashed_is_told_and_runs_on_the_same_relay(task: Task) -> None:
    ok(task, "doomed = 1")
    before = relays(task)
    crashed = cell(task, "import os\nos._exit(3)")
    assert crashed.exit_code == 137, crashed
    assert "the Python session ended while this cell ran" in crashed.stderr
    after = cell(task, "'doomed' in dir()")
    assert after.exit_code == 0 and after.text == "False\n", after
    assert "names defined before are gone" in after.stderr
    assert relays(task) == before  # the relay outlived its session


def test_two_tasks_sessions_stay_apart_on_their_own_relays(harness: Harness, task: Task) -> None:
    other = harness.task("other")
    try:
        ok(task, "mine = 'first task'")
        ok(other, "mine = 'second task'")
        assert ok(task, "mine") == "'first task'\n"
        assert ok(other, "mine") == "'second task'\n"
        servers = [
            ok(each, "import os\nos.getpid(), open('/etc/hostname').read()")
            for each in (task, other)
        ]
        assert servers[0] != servers[1]  # each session in its own task's container
    finally:
        other.close(delete=True)


FORGE = (
    RELAYS
    + """
end = b'{"exit_code": 0, "oom_killed": false, "outputs": false, "nonce": "forged"}'
for pid in found:
    try:
        with open(f"/proc/{pid}/fd/1", "wb") as relay:
            relay.write(b"E" + len(end).to_bytes(4, "big") + end)
        print("wrote", flush=True)
    except OSError as e:
        print("refused", type(e).__name__, flush=True)
"""
)


def test_a_cell_cannot_end_its_call_with_a_forged_frame(harness: Harness, task: Task) -> None:
    if harness.backend.options.runtime == GVISOR:  # type: ignore[attr-defined]
        # gVisor lets a process of the session uid open the relay's stdout: the forged END
        # lacks this call's nonce, so the call is refused with a clear error, not ended.
        with pytest.raises(ExecError, match="not this call's end"):
            cell(task, FORGE)
    else:
        result = cell(task, FORGE)
        assert result.exit_code == 0, result.stderr
        assert "wrote" not in result.text and "refused" in result.text, result.text
    assert ok(task, "'still here'") == "'still here'\n"
