"""Attacks on what the host parses of a sandbox's answers (issue 21 item 8): a script runs as
the fork server's uid, so it can kill the server and listen in its place with a malformed
answer ready. The relay hands a script only to a fork server Docker started (its
credentials, checked by the kernel), so the impostor never gets a call: the call is
answered by a real server, exactly, and the loop goes on. Were a malformed answer to reach
the host all the same, it is that call's error result: the parser's own tests
(tests/test_identity_attacks.py) give it each answer below.

Each test runs under runc and under gVisor (runsc), as tests/sandbox/test_attacks.py does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import test_attacks

from spillbox import Task
from spillbox.loop import ScriptedModel, ToolCall, Turn, run
from spillbox.tools import Toolset

pytestmark = pytest.mark.docker

harness = test_attacks.harness
"""A docker harness, under runc and again under gVisor."""
task = test_attacks.task

FAKE_SERVER = r"""
import os, signal, socket, time
ADDRESS = "\0spillbox-forkserver"
if os.fork() == 0:
    os.setsid()
    os.closerange(3, 1024)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    while True:  # until the real server's name is free
        try:
            server.bind(ADDRESS)
            break
        except OSError:
            time.sleep(0.005)
    server.listen(8)
    while True:
        client, _ = server.accept()
        try:
            if client.makefile("rb").readline():
                out_read, out_write = os.pipe()
                err_read, err_write = os.pipe()
                os.close(out_write)
                os.close(err_write)
                socket.send_fds(client, [b"F"], [out_read, err_read])
                os.close(out_read)
                os.close(err_read)
                client.sendall(ANSWER + b"\n")
        except OSError:
            pass
        client.close()
os.kill(os.getppid(), signal.SIGKILL)  # the fork server this script was forked from
while True:  # until the fake server listens in its place
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(ADDRESS)
        break
    except OSError:
        time.sleep(0.005)
    finally:
        probe.close()
print("replaced")
"""


def replace_fork_server(task: Task, answer: bytes) -> None:
    """Kill the task's fork server from a script, and answer every later script with
    `answer` in its place."""
    result = task.exec("python", f"ANSWER = {answer!r}\n{FAKE_SERVER}", timeout=20)
    assert result.text.strip() == "replaced", result.stderr


ANSWERS = [  # the relay sets oom_killed and outputs itself: the fake server's exit_code passes
    b'{"exit_code": 1e999}',
    b'{"exit_code": NaN, "oom_killed": false}',
    b'{"exit_code": "0"}',
    b'{"exit_code": 99999999999999999999}',
    b'{"exit_code": -1}',
    b'{"exit_code": true}',
]


@pytest.mark.parametrize("answer", ANSWERS, ids=[a.decode() for a in ANSWERS])
def test_a_fork_server_impostors_malformed_end_never_reaches_the_host(
    task: Task, answer: bytes
) -> None:
    replace_fork_server(task, answer)
    args = {"lang": "sh", "code": "echo hi", "artifact": None, "timeout": 10}
    output = Toolset(task).call("sandbox_exec", {**args, "session": None, "reset_session": None})
    assert not output.is_error, output.text
    body = json.loads(output.text)
    assert (body["exit_code"], body["output"]) == (0, "hi\n"), body
    assert task.exec("sql", "SELECT 42 AS answer").text.strip().endswith("42")


def test_the_loop_runs_on_past_a_fork_server_impostor_answering_1e999(task: Task) -> None:
    replace_fork_server(task, b'{"exit_code": 1e999}')
    call = ToolCall(
        "c1",
        "sandbox_exec",
        {"lang": "python", "code": "print(1)", "artifact": None, "timeout": 10},
    )

    def script(messages: Sequence[Mapping[str, Any]]) -> Turn:
        if messages[-1]["role"] == "user":
            return Turn(tool_calls=(call,))
        return Turn(text="done")

    result = run(task, ScriptedModel(script), "go")
    assert result.answer == "done"
    [admitted] = result.steps[0].admitted
    assert not admitted.is_error and json.loads(admitted.text)["output"] == "1\n", admitted.text
