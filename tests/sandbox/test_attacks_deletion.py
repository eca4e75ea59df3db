"""Attacks on deletion (issue 21 items 5 and 6): a deleted payload must leave no copy in any
place a script or a session cell can write, no process holding it in memory, none serving
in the fork server's place; and nothing SQL writes may reach past a size cap onto the host.

Each test runs under runc and again under gVisor (the harness fixture of test_attacks).
"""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import test_attacks
from test_attacks import payload, probe, script_leftovers

from spillbox import Task, ToolResult
from spillbox.sandbox.docker import DockerBackend
from spillbox.sandbox.docker.layout import SCRIPT_USER

pytestmark = pytest.mark.docker

harness = test_attacks.harness
task = test_attacks.task

SCRIPT_COPIES = """
import os
data = open({path!r}, "rb").read()
for folder in ("/dev/shm", "/tmp", "/sandbox/work"):
    open(f"{{folder}}/kept-copy", "wb").write(data)
    open(f"{{folder}}/kept-upper", "wb").write(data.upper())  # a conversion: other bytes
os.makedirs("/sandbox/work/hid/den", exist_ok=True)
open("/sandbox/work/hid/den/copy", "wb").write(data)
print("[]")
"""

CELL_COPIES = """
data = open({path!r}, "rb").read()
kept = data
for folder in ("/sandbox/run", "/dev/shm", "/tmp", "/sandbox/work"):
    open(f"{{folder}}/cell-copy", "wb").write(data)
print(len(kept))
"""

IMPOSTOR = """
import os, signal, socket, time
data = open({path!r}, "rb").read()
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
for fd in (0, 1, 2):
    os.close(fd)
os.kill({server}, signal.SIGKILL)  # the fork server: the same uid as this script
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
for _ in range(500):
    try:
        listener.bind("\\0spillbox-forkserver")
        break
    except OSError:
        time.sleep(0.01)
listener.listen(8)
open("/sandbox/work/impostor.pid", "w").write(str(os.getpid()))
while True:  # serves every call in the server's place, the payload in its memory
    client, _ = listener.accept()
    client.sendall(b"H")
    asked = client.recv(1 << 16)
    with open("/sandbox/work/captured", "ab") as log:
        log.write(asked)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    socket.send_fds(client, [b"F"], [out_read, err_read])
    os.write(out_write, b"impostor " + data[:16] + b"\\n")
    for fd in (out_read, err_read, out_write, err_write):
        os.close(fd)
    client.sendall(b'{{"exit_code": 0}}\\n')
    client.close()
"""

FIND = """
import json, os
marker = {marker!r}.encode()
found = []
for top in {folders!r}:
    for path, dirs, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(path, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue  # another uid's: the probe as that uid looks
            if marker in data or marker.upper() in data:
                found.append(os.path.join(path, name))
print(json.dumps(found))
"""

IPC = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
made = {
    "shm": libc.shmget(0x5B1D, 4096, 0o1000 | 0o600) != -1,
    "msg": libc.msgget(0x5B1E, 0o1000 | 0o600) != -1,
    "sem": libc.semget(0x5B1F, 1, 0o1000 | 0o600) != -1,
    "mq": rt.mq_open(b"/kept", os.O_CREAT | os.O_RDWR, 0o600, None) != -1,
    # shmget by its number in x86_64's x32 ABI, around a filter that lists only the others
    "x32": libc.syscall(0x40000000 | 29, 0, 4096, 0o1000 | 0o600) != -1,
}
print(json.dumps(made))
"""


def server_pid(task: Task) -> int:
    """The fork server's pid (the parent of a python script)."""
    pid: int = probe(task, "import os, json; print(json.dumps(os.getppid()))")
    return pid


def inside(task: Task, command: str) -> str:
    """What a shell command says in the task's container, run as the script uid by a
    `docker exec` of its own: not through the fork server (or what poses as it)."""
    backend = task.harness.backend
    assert isinstance(backend, DockerBackend)
    done = backend.container(task.storage).exec_run(["sh", "-c", command], user=SCRIPT_USER)
    text: str = done.output.decode()
    return text


def wait_for(task: Task, path: str) -> str:
    """The contents of a file in the container, once it exists."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = inside(task, f"cat {path} 2>/dev/null")
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def test_a_deleted_payload_leaves_no_copy_and_no_process_holding_it(task: Task) -> None:
    marker = f"deleted-{uuid.uuid4().hex}"
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload(marker))])
    assert admitted.artifact is not None
    path = admitted.artifact.path
    assert probe(task, SCRIPT_COPIES.format(path=path)) == []
    copied = task.exec("python", CELL_COPIES.format(path=path), session=True)
    assert copied.exit_code == 0, copied.stderr
    server = server_pid(task)
    with ThreadPoolExecutor(1) as pool:
        # A script of another call, holding the bytes in memory while the deletion runs.
        holder = pool.submit(
            task.exec,
            "python",
            f"data = open({path!r}, 'rb').read()\nopen('/tmp/holding', 'w').write('1')\n"
            "import time\ntime.sleep(120)",
            timeout=120,
        )
        wait_for(task, "/tmp/holding")
        # Its run ends when it has killed the fork server (its own end may not be said).
        task.exec("python", IMPOSTOR.format(path=path, server=server))
        impostor = int(wait_for(task, "/sandbox/work/impostor.pid"))
        assert inside(task, f"kill -0 {impostor} && echo alive") == "alive\n"
        task.delete("c1")
        held = holder.result()
    assert not held.timed_out and held.exit_code != 0, held  # killed by the deletion
    assert inside(task, f"kill -0 {impostor} 2>/dev/null || echo gone") == "gone\n"
    scripts = ["/sandbox/work", "/sandbox/outputs", "/tmp", "/dev/shm"]
    assert probe(task, FIND.format(marker=marker, folders=scripts)) == []
    cells = ["/sandbox/run", "/tmp", "/dev/shm", "/sandbox/work"]
    found = task.exec("python", FIND.format(marker=marker, folders=cells), session=True)
    assert found.exit_code == 0 and json.loads(found.text) == [], (found.text, found.stderr)
    assert "names defined before are gone" in found.stderr  # the session went too
    gone = task.exec("python", "print('kept' in dir())", session=True)
    assert gone.text == "False\n"
    genuine = task.exec("sh", "echo genuine")
    assert (genuine.exit_code, genuine.text) == (0, "genuine\n"), genuine
    assert script_leftovers(task) == []


@pytest.mark.parametrize("where", ["script", "sh", "cell"])
def test_no_ipc_object_that_outlives_its_processes_can_be_made(task: Task, where: str) -> None:
    """System V IPC and POSIX message queues hold bytes past every process, in no folder a
    deletion walks: none can be made, by a python script, a program sh starts, or a session
    cell. Under runc the container's IPC limits are 0; gVisor ignores those, and the seccomp
    filter the fork server and the session relay install refuses the calls in both."""
    if where == "sh":
        code = f"python3 - <<'EOF'\n{IPC}\nEOF"
        result = task.exec("sh", code, timeout=20)
    else:
        result = task.exec("python", IPC, timeout=20, session=where == "cell")
    assert result.exit_code == 0, result.stderr
    made = json.loads(result.text)
    assert made == {"shm": False, "msg": False, "sem": False, "mq": False, "x32": False}


def test_sql_cannot_write_past_a_cap_onto_the_hosts_disk(task: Task) -> None:
    """DuckDB may write under its own temporary directory (COPY too), by default beside its
    database on the host's disk: it has none, and what COPY may write is capped."""
    storage = task.storage
    setting = task.exec("sql", "SELECT current_setting('temp_directory') AS t")
    assert setting.text.split() == ["t", '""'] or setting.text.split() == ["t"], setting.text
    for target in (
        "/sandbox/cache/tables.duckdb.tmp/big.csv",
        "/sandbox/cache/tables.duckdb.tmp/../big.csv",
        "/sandbox/cache/big.csv",
        "/sandbox/cache/tables.duckdb.wal",
    ):
        refused = task.exec("sql", f"COPY (SELECT 1 AS x) TO '{target}'")
        assert refused.exit_code != 0, target
        said = refused.stderr
        assert "disabled by configuration" in said or "attached database" in said, (target, said)
    # 400 MB into the 256 MB work folder: stopped at its cap, as it is written.
    big = task.exec(
        "sql", "COPY (SELECT repeat('x', 1000) AS s FROM range(400000)) TO '/sandbox/work/big.csv'"
    )
    assert big.exit_code != 0, big.text
    assert "space" in big.stderr.lower(), big.stderr
    on_host = sum(f.stat().st_size for f in Path(storage.root).rglob("*") if f.is_file())
    assert on_host < 16 * 1024 * 1024, on_host
    alive = task.exec("sql", "SELECT 42 AS answer")
    assert alive.text.split() == ["answer", "42"], alive.stderr
