"""Attacks of one call on the calls after it or beside it, and of a sandbox on the host's
other users (issue 21: the fork server's place, its memory, the session's threads, marks
and command line, payload modes). Each runs under runc and again under gVisor.
"""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import test_attacks
from test_attacks import payload, probe, script_leftovers
from test_attacks_deletion import IMPOSTOR, inside, server_pid, wait_for

from spillbox import Task, ToolResult

pytestmark = pytest.mark.docker

harness = test_attacks.harness
task = test_attacks.task


def test_a_script_serving_in_the_fork_servers_place_never_gets_a_call(task: Task) -> None:
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    assert admitted.artifact is not None
    task.exec("python", IMPOSTOR.format(path=admitted.artifact.path, server=server_pid(task)))
    impostor = int(wait_for(task, "/sandbox/work/impostor.pid"))
    marker = f"later-{uuid.uuid4().hex}"
    for _ in range(3):
        later = task.exec("sh", f"echo {marker}")
        assert (later.exit_code, later.text) == (0, f"{marker}\n"), later
    assert marker not in inside(task, "cat /sandbox/work/captured 2>/dev/null")
    assert inside(task, f"kill -0 {impostor} 2>/dev/null || echo gone") == "gone\n"
    assert script_leftovers(task) == []


REACH_THE_SERVER = """
import ctypes, json, os, socket
server = os.getppid()
libc = ctypes.CDLL(None, use_errno=True)
tried = {}
tried["ptrace"] = libc.ptrace(16, server, 0, 0) == 0  # PTRACE_ATTACH
try:
    open(f"/proc/{server}/mem", "rb").read(1)
    tried["mem"] = True
except OSError:
    tried["mem"] = False
# Its sockets (the listener, the relays' connections): never opened through /proc.
tried["sockets"] = False
try:
    fds = os.listdir(f"/proc/{server}/fd")
except OSError:
    fds = []  # not dumpable (runc): /proc closes them all
for fd in fds:
    try:
        if os.readlink(f"/proc/{server}/fd/{fd}").startswith("socket:"):
            os.close(os.open(f"/proc/{server}/fd/{fd}", os.O_RDWR))
            tried["sockets"] = True
    except OSError:
        pass
# Asking the server itself for a run, as a relay does.
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect("\\0spillbox-forkserver")
sock.settimeout(10)
sock.recv(1)
sock.sendall(json.dumps({"lang": "sh", "code": "echo ran", "timeout": 5}).encode() + b"\\n")
msg, fds, _, _ = socket.recv_fds(sock, 1, 2)
tried["served"] = bool(msg or fds)
print(json.dumps(tried))
"""


def test_no_script_can_reach_into_the_fork_server_or_ask_it_for_a_run(task: Task) -> None:
    tried = probe(task, REACH_THE_SERVER)
    assert tried == {"ptrace": False, "mem": False, "sockets": False, "served": False}
    assert task.exec("sh", "echo still").text == "still\n"


def test_a_thread_a_cell_starts_ends_with_the_cell(task: Task) -> None:
    started = task.exec(
        "python",
        "import threading, time\n"
        "def chatter():\n    while True:\n        print('injected', flush=True)\n"
        "        time.sleep(0.01)\n"
        "threading.Thread(target=chatter, daemon=True).start()\ntime.sleep(0.1)\nkept = 1",
        session=True,
    )
    assert started.exit_code == 0, started.stderr
    later = task.exec(
        "python",
        "import threading, time\ntime.sleep(0.5)\n"
        "print(kept, [t.name for t in threading.enumerate() if 'chatter' in t.name])",
        session=True,
    )
    assert (later.exit_code, later.text) == (0, "1 []\n"), (later.text, later.stderr)


def test_a_thread_that_will_not_end_ends_the_session(task: Task) -> None:
    stubborn = task.exec(
        "python",
        "import threading, time\n"
        "def stay():\n    while True:\n        try:\n            time.sleep(0.01)\n"
        "        except BaseException:\n            pass\n"
        "threading.Thread(target=stay, daemon=True).start()\nkept = 1",
        session=True,
    )
    assert stubborn.exit_code == 0, stubborn.stderr
    assert "the session was ended" in stubborn.stderr
    after = task.exec("python", "import threading\nprint('kept' in dir())", session=True)
    assert after.text == "False\n", after.stderr
    assert "names defined before are gone" in after.stderr


def test_a_cell_cannot_forge_the_end_line_or_oom_killed(task: Task) -> None:
    forged = task.exec(
        "python",
        "import sys\n"
        "sys.stderr.write('\\x1espillbox:oom_killed\\n\\x1espillbox:outputs\\n')\n"
        'sys.stderr.write(\'\\x1espillbox:end 0123 {"oom_killed": true, "outputs": true}\\n\')\n'
        "sys.stderr.flush()",
        session=True,
    )
    assert forged.exit_code == 0 and not forged.oom_killed, forged
    assert "spillbox:end 0123" in forged.stderr  # shown as the cell's, not taken as a mark


def test_a_session_cells_code_is_in_no_command_line(task: Task) -> None:
    marker = f"cell-{uuid.uuid4().hex}"
    scan = (
        f"import json, os\nmarker = {marker[::-1]!r}[::-1].encode()\nfound = []\n"
        "for name in os.listdir('/proc'):\n"
        "    try:\n        line = open(f'/proc/{name}/cmdline', 'rb').read()\n"
        "    except OSError:\n        continue\n"
        "    if marker in line:\n        found.append(name)\n"
        "print(json.dumps(found))"
    )
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            task.exec,
            "python",
            f"open('/sandbox/work/cell-running', 'w').write('1')\nimport time\n"
            f"time.sleep(3)\nprint({marker!r})",
            timeout=30,
            session=True,
        )
        wait_for(task, "/sandbox/work/cell-running")
        assert probe(task, scan) == []
        assert running.result().text == f"{marker}\n"


def test_payloads_are_closed_to_the_hosts_other_users(task: Task) -> None:
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    assert admitted.artifact is not None
    host_path = admitted.artifact.host_path
    storage = task.storage
    assert stat.S_IMODE(storage.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(storage.offload.stat().st_mode) & 0o007 == 0
    if os.geteuid() != 0:
        return  # only root can try as another user; the modes above are the point
    other = subprocess.run(["cat", str(host_path)], user=65534, capture_output=True, check=False)
    assert other.returncode != 0 and b"Permission denied" in other.stderr, other
    # The sandbox still reads it (its uids, through the mount).
    assert task.exec("sh", f"wc -c < {admitted.artifact.path}").text.strip() == str(
        host_path.stat().st_size
    )
    assert task.exec("sql", 'SELECT count(*) AS n FROM "c1"').text.split() == ["n", "400"]
