"""Attacks on the Docker sandbox, each asserting that the attack fails.

Every test runs under the engine's default runtime and again under gVisor ("runsc") where
the engine has it; gVisor is an optional stronger mode, so its absence skips, never fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import spillbox.sandbox.docker.pool as pool
from conftest import GVISOR, pooled_task, runtime_or_skip
from spillbox import Harness, SpillboxError, Task, ToolResult
from spillbox.sandbox.docker import (
    ENGINE_USER,
    LABEL_EXPIRES,
    LABEL_OWNER,
    LABEL_SLOT,
    LABEL_TASK,
    OUTPUT_TAIL_BYTES,
    SCRIPT_UID,
    DockerBackend,
    SandboxOptions,
)
from spillbox.sandbox.storage import CACHE_DIR, OFFLOAD_DIR

pytestmark = pytest.mark.docker


@pytest.fixture(params=[None, GVISOR], ids=["runc", "gvisor"])
def harness(
    request: pytest.FixtureRequest, docker_client: Any, docker_home: Path
) -> Iterator[Harness]:
    """A docker harness whose sandboxes use the parametrized OCI runtime."""
    runtime = runtime_or_skip(docker_client, request.param)
    with Harness(
        sandbox="docker", home=docker_home, options=SandboxOptions(runtime=runtime)
    ) as harness:
        yield harness


@pytest.fixture
def task(harness: Harness) -> Iterator[Task]:
    """A task whose sandbox is a warm pool slot, as users get by default (the tests that
    make their own tasks with harness.task take the cold path)."""
    task = pooled_task(harness, "attacker")
    yield task
    task.close(delete=True)


def task_filters(task: Task) -> dict[str, Any]:
    """Docker's filters that find the task's container (its own, or the slot it adopted)."""
    return {"id": task.harness.backend.container(task.storage).id}  # type: ignore[attr-defined]


def mount_sources(task: Task) -> set[str]:
    """The host folders the task's container was made with: the task's offload and cache,
    or a pool slot's before the task adopted it (renamed onto the task's since: a bind
    mount follows its folder, and Docker shows the path it was given)."""
    storage = task.storage
    slot = pool.adopted(task.harness.settings.home, storage)
    root = storage.root if slot is None else task.harness.settings.home / pool.SLOTS_DIR / slot
    return {str(root / OFFLOAD_DIR), str(root / CACHE_DIR)}


def payload(marker: str, rows: int = 400) -> str:
    """A JSON array large enough to be offloaded, carrying a marker."""
    return json.dumps([{"id": i, "secret": marker, "pad": "x" * 200} for i in range(rows)])


def probe(task: Task, code: str, timeout: float = 20.0) -> Any:
    """Run a python probe that prints one JSON value; return that value."""
    result = task.exec("python", code, timeout=timeout)
    assert result.exit_code == 0, result.stderr
    assert not result.offloaded, result.text
    return json.loads(result.text)


LEFTOVERS = """
import json, os
def status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return fields
# This probe and the processes that started it are not leftovers.
mine, pid = set(), os.getpid()
while pid > 0:
    mine.add(pid)
    try:
        pid = int(status(pid)["PPid"][0])
    except OSError:
        break
left = []
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) in mine:
        continue
    try:
        fields = status(name)
        with open(f"/proc/{name}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        continue  # exited meanwhile
    # A zombie, or a process with SIGKILL pending that the kernel has yet to tear down,
    # is already dead.
    # gVisor's /proc has no pending-signal fields: there, a zombie is the only sign.
    pending = int(fields.get("SigPnd", ["0"])[0], 16) | int(fields.get("ShdPnd", ["0"])[0], 16)
    dead = fields["State"][0] in ("Z", "X") or pending & (1 << 8)
    # Parent 0: a process Docker entered (a relay, the fork server), never one a script made.
    if not dead and fields["PPid"][0] != "0":
        left.append([int(fields["Uid"][0]), fields["Name"][0], cmdline])
print(json.dumps(left))
"""


def scripts_uid(task: Task) -> int:
    """The uid the task's python and sh run as: the script uid, or the session's for a task
    whose scripts run in its session (test_session.py runs these tests so)."""
    uid: int = getattr(task, "scripts_uid", SCRIPT_UID)
    return uid


def script_leftovers(task: Task) -> list[list[Any]]:
    """Live processes of the scripts' uid in the task's container (this probe aside)."""
    return [p for p in probe(task, LEFTOVERS) if p[0] == scripts_uid(task)]


def test_network_is_unreachable(task: Task, docker_client: Any) -> None:
    bridge = docker_client.networks.get("bridge").attrs["IPAM"]["Config"]
    gateway = next((c["Gateway"] for c in bridge if "Gateway" in c), "172.17.0.1")
    found = probe(
        task,
        f"""
import json, socket
out = {{"interfaces": [name for _, name in socket.if_nameindex()]}}
for host, port in [("1.1.1.1", 53), ({gateway!r}, 53), ({gateway!r}, 2375), ("8.8.8.8", 443)]:
    try:
        socket.create_connection((host, port), timeout=3).close()
        out[f"{{host}}:{{port}}"] = "connected"
    except OSError as e:
        out[f"{{host}}:{{port}}"] = type(e).__name__
try:
    out["dns"] = socket.getaddrinfo("example.com", 443)[0][4][0]
except OSError:
    out["dns"] = "failed"
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", ("1.1.1.1", 53))
    out["udp"] = "sent"
except OSError:
    out["udp"] = "failed"
print(json.dumps(out))
""",
    )
    assert found.pop("interfaces") == ["lo"]
    assert found.pop("dns") == "failed"
    assert found.pop("udp") == "failed"
    assert "connected" not in found.values(), found


def test_root_filesystem_is_read_only_and_tmp_is_capped(task: Task, harness: Harness) -> None:
    assert isinstance(harness.backend, DockerBackend)
    cap = harness.backend.options.tmp_size
    assert cap.endswith("m")
    over = int(cap[:-1]) + 8  # MiB: past the cap
    found = probe(
        task,
        f"""
import json, os
out = {{}}
for path in ["/etc/evil", "/usr/evil", "/opt/spillbox/evil", "/evil", "/sandbox/evil",
             "/sandbox/offload/evil", "/usr/bin/python3", "/opt/spillbox/run.sh"]:
    try:
        with open(path, "ab") as f:
            f.write(b"x")
        out[path] = "wrote"
    except OSError as e:
        out[path] = e.strerror
for path in ["/etc/cron.d", "/var/evil"]:
    try:
        os.mkdir(path + "/x" if os.path.isdir(path) else path)
        out[path] = "made"
    except OSError as e:
        out[path] = e.strerror
with open("/tmp/small", "wb") as f:
    f.write(b"ok")
out["tmp_small"] = open("/tmp/small", "rb").read().decode()
written = 0
try:
    with open("/tmp/big", "wb") as f:
        for _ in range({over}):
            f.write(b"\\0" * 1024 * 1024)
            written += 1
        f.flush()
        os.fsync(f.fileno())
    out["tmp_big"] = "wrote"
except OSError as e:
    out["tmp_big"] = e.strerror
out["tmp_big_mib"] = written
for leftover in ("/tmp/small", "/tmp/big"):
    os.remove(leftover)
print(json.dumps(out))
""",
    )
    assert found.pop("tmp_small") == "ok"
    assert found.pop("tmp_big") == "No space left on device", found
    assert found.pop("tmp_big_mib") < over
    assert "wrote" not in found.values() and "made" not in found.values(), found


FILL_WORK = """
import errno, json, os
out = {{"written_mib": 0}}
try:
    with open("/sandbox/work/fill", "wb", buffering=0) as f:
        block = bytes(1 << 20)
        for _ in range({over}):
            f.write(block)
            out["written_mib"] += 1
    out["error"] = None
except OSError as e:
    out["error"] = errno.errorcode[e.errno]
    out["message"] = e.strerror
print(json.dumps(out))
"""


def storage_bytes(root: Path) -> int:
    return sum(
        os.lstat(os.path.join(folder, name)).st_size
        for folder, _, files in os.walk(root)
        for name in files
    )


def test_a_script_cannot_write_past_the_work_cap_nor_onto_the_hosts_disk(
    task: Task, harness: Harness, docker_client: Any
) -> None:
    """Every folder a script can write is a tmpfs with a size cap: a write past it fails at
    once (ENOSPC), in a script and in a query's COPY alike, and nothing reaches the host's
    disk: not the task's storage, not the container's own layer."""
    assert isinstance(harness.backend, DockerBackend)
    cap = harness.backend.options.work_size
    assert cap.endswith("m")
    over = 2 * int(cap[:-1])  # MiB: twice the cap
    found = probe(task, FILL_WORK.format(over=over), timeout=120)
    assert found["error"] == "ENOSPC", found
    assert found["message"] == "No space left on device"
    assert int(cap[:-1]) - 8 <= found["written_mib"] <= int(cap[:-1]), found
    copy = task.exec(
        "sql", "COPY (SELECT repeat('x', 1000) AS pad FROM range(300000)) TO '/sandbox/work/q.csv'"
    )
    assert copy.exit_code != 0 and "No space left on device" in copy.stderr, copy.stderr
    [listed] = docker_client.api.containers(size=True, filters=task_filters(task))
    layer = listed.get("SizeRw") or 0
    assert layer < 1 << 20, layer
    assert storage_bytes(task.storage.root) < 1 << 20
    # The task goes on: freeing the folder frees the cap.
    freed = task.exec("sh", "rm /sandbox/work/fill /sandbox/work/q.csv; echo ok > /sandbox/work/f")
    assert freed.exit_code == 0, freed.stderr
    assert task.exec("sh", "cat /sandbox/work/f").text.strip() == "ok"


def test_scripts_run_unprivileged(task: Task) -> None:
    found = probe(
        task,
        """
import json, os, subprocess
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines())
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}
# gVisor's /proc/self/status lacks CapAmb and NoNewPrivs (its kernel enforces both).
out.update({k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                          "NoNewPrivs") if k in status})
out["id -u"] = subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip()
for name, call in [("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                   ("chown", lambda: os.chown("/sandbox/work", 0, 0)),
                   ("chroot", lambda: os.chroot("/tmp"))]:
    try:
        call()
        out[name] = "allowed"
    except OSError as e:
        out[name] = e.strerror
su = subprocess.run(["su", "-c", "id -u", "root"], stdin=subprocess.DEVNULL,
                    capture_output=True, text=True)
out["su"] = su.stdout.strip() or su.stderr.strip() or str(su.returncode)
print(json.dumps(out))
""",
    )
    assert found["uid"] == found["euid"] == scripts_uid(task)
    assert found["id -u"] == str(scripts_uid(task))
    assert 0 not in [found["gid"], *found["groups"]]
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(found.get(field, "0"), 16) == 0, (field, found.get(field))
    assert found.get("NoNewPrivs", "1") == "1"  # gVisor: see the setuid-binary test
    for name in ("setuid", "setgid", "chown", "chroot"):
        assert found[name] == "Operation not permitted", (name, found[name])
    assert found["su"] != "0", found["su"]


def test_a_program_planted_in_work_does_not_run_even_setuid(task: Task, harness: Harness) -> None:
    """A setuid program of the engine's uid (the only other uid that can write the work
    folder; root cannot, with no capabilities) planted in work does not run at all: the
    folder is noexec and nosuid (and no-new-privileges holds besides). The image has no
    setuid program."""
    assert isinstance(harness.backend, DockerBackend)
    container = harness.backend.container(task.storage)
    planted = container.exec_run(
        ["sh", "-c", "cp /usr/bin/id /sandbox/work/suid-id && chmod 4755 /sandbox/work/suid-id"],
        user=ENGINE_USER,
    )
    assert planted.exit_code == 0, planted.output
    result = task.exec("sh", "/sandbox/work/suid-id -u")
    assert result.exit_code == 126 and "Permission denied" in result.stderr, result
    as_script = task.exec("sh", "cp /usr/bin/id /sandbox/work/own-id && /sandbox/work/own-id")
    assert as_script.exit_code == 126, as_script


def test_a_script_cannot_kill_init_or_the_sql_engine(task: Task) -> None:
    task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    assert task.exec("sql", 'SELECT count(*) AS n FROM "c1"').exit_code == 0  # engine is up
    assert task.exec("sh", "true").exit_code == 0  # a relay into the fork server is up
    found = probe(
        task,
        """
import json, os, signal
out = {}
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    try:
        with open(f"/proc/{name}/status") as f:
            uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
        with open(f"/proc/{name}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\\0", b" ").decode().strip()
    except (OSError, StopIteration):
        continue
    if uid != os.getuid():
        try:
            os.kill(int(name), signal.SIGKILL)
            out[cmdline] = "killed"
        except OSError as e:
            out[cmdline] = e.strerror
print(json.dumps(out))
""",
    )
    assert any("sqlserver" in cmdline for cmdline in found), found
    assert any("forkserver.py relay" in cmdline for cmdline in found), found
    assert set(found.values()) == {"Operation not permitted"}, found
    again = task.exec("sql", 'SELECT count(*) AS n FROM "c1"')
    assert (again.exit_code, again.text.split()) == (0, ["n", "400"])


ENGINE_PROBE = """
import os, socket
s = socket.socket(socket.AF_UNIX)
for what, act in (
    ("connect", lambda: s.connect("/sandbox/cache/engine.sock")),
    ("replace", lambda: os.rename("/tmp", "/sandbox/cache/engine.sock")),
    ("plant", lambda: socket.socket(socket.AF_UNIX).bind("/sandbox/cache/other.sock")),
    ("read tables", lambda: open("/sandbox/cache/tables.duckdb", "rb").read(1)),
    ("read log", lambda: open("/sandbox/cache/engine.log", "rb").read(1)),
):
    try:
        act()
        print(what, "done")
    except OSError as e:
        print(what, e.errno)
"""


def test_a_script_cannot_reach_or_replace_the_sql_engine(task: Task) -> None:
    """Every process of the task queries through the one engine's socket: a script that
    could talk to it, or put its own in its place, could answer other processes' queries."""
    task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    assert task.exec("sql", 'SELECT count(*) AS n FROM "c1"').exit_code == 0  # engine is up
    result = task.exec("python", ENGINE_PROBE)
    assert result.exit_code == 0, result.stderr
    lines = result.text.splitlines()
    assert len(lines) == 5 and not [line for line in lines if line.endswith("done")], lines
    again = task.exec("sql", 'SELECT count(*) AS n FROM "c1"')
    assert (again.exit_code, again.text.split()) == (0, ["n", "400"])


def test_one_task_cannot_reach_another_tasks_payload(harness: Harness) -> None:
    marker = f"BRAVO-SECRET-{uuid.uuid4().hex}"
    alpha, bravo = harness.task("alpha"), harness.task("bravo")
    try:
        [theirs] = bravo.admit([ToolResult(call_id="b1", tool="t", content=payload(marker))])
        [mine] = alpha.admit([ToolResult(call_id="a1", tool="t", content=payload("alpha"))])
        assert theirs.artifact is not None and mine.artifact is not None
        host_path = str(theirs.artifact.host_path)
        # The marker and bravo's paths are passed hex-encoded, so the probe's own command
        # line (visible in /proc) does not contain what it searches for.
        needles = [marker, host_path, str(bravo.storage.root), theirs.artifact.name]
        found = probe(
            alpha,
            f"""
import json, os
needles = [bytes.fromhex(h) for h in {[n.encode().hex() for n in needles]!r}]
host_path = needles[1].decode()
out = {{"listing": {{}}, "opened": {{}}, "hits": []}}
for folder in ["/sandbox", "/sandbox/offload", "/sandbox/work", "/sandbox/cache"]:
    try:
        out["listing"][folder] = sorted(os.listdir(folder))
    except OSError as e:
        out["listing"][folder] = e.strerror
for guess in [host_path, "/sandbox/offload/" + needles[3].decode(),
              "/sandbox/offload/../../" + host_path.lstrip("/"),
              "/proc/1/root" + host_path, "/proc/1/root/sandbox/offload/" + needles[3].decode()]:
    try:
        with open(guess, "rb") as f:
            out["opened"][guess] = len(f.read())
    except OSError as e:
        out["opened"][guess] = e.strerror
def scan(path, limit=1 << 26):
    try:
        with open(path, "rb") as f:
            data = f.read(limit)
    except OSError:
        return
    for n, needle in enumerate(needles[:3]):
        if needle in data:
            out["hits"].append([path, n])
for base in ["/sandbox", "/tmp", "/run", "/var", "/home", "/root", "/mnt", "/srv", "/dev/shm"]:
    for folder, _, files in os.walk(base):
        for name in files:
            scan(os.path.join(folder, name))
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for leaf in ("cmdline", "environ", "mountinfo", "mounts"):
        scan(f"/proc/{{pid}}/{{leaf}}")
print(json.dumps(out))
""",
        )
        assert found["listing"]["/sandbox/offload"] == [mine.artifact.name]
        assert found["listing"]["/sandbox/cache"] == "Permission denied"
        assert theirs.artifact.name not in json.dumps(found["listing"])
        assert "No such file or directory" in found["opened"].values()
        assert all(isinstance(v, str) for v in found["opened"].values()), found["opened"]
        assert found["hits"] == [], found["hits"]
        for sql in (f"SELECT * FROM read_text('{host_path}')", 'SELECT * FROM "b1"'):
            result = alpha.exec("sql", sql)
            assert result.exit_code != 0 and marker not in result.text, (sql, result.text)
    finally:
        alpha.close(delete=True)
        bravo.close(delete=True)


FORK_UNTIL_REFUSED = """
import os, sys, time
children = 0
try:
    for _ in range({bound}):
        if os.fork() == 0:
            os.setsid()  # out of the script's group: only the uid-wide sweep reaches it
            time.sleep(30)
            os._exit(0)
        children += 1
    print("no limit hit", children, flush=True)
except OSError as e:
    print("refused", children, e.errno, flush=True)
time.sleep(30)  # hold the limit until the timeout
"""


def test_fork_bomb_hits_the_pids_limit_and_the_task_survives(task: Task, harness: Harness) -> None:
    assert isinstance(harness.backend, DockerBackend)
    limit = harness.backend.options.pids
    result = task.exec("python", FORK_UNTIL_REFUSED.format(bound=limit + 100), timeout=5)
    if harness.backend.options.runtime == "runsc":
        # gVisor ends a bomb at the pids limit itself, before the script can report.
        assert "no limit hit" not in result.text
        assert result.exit_code != 0
    else:
        outcome, children, *errno = result.text.split()
        assert outcome == "refused", result.text
        assert int(children) < limit
        assert errno == ["11"]  # EAGAIN
        assert result.timed_out
    assert script_leftovers(task) == []
    after = task.exec("sh", "echo alive")
    assert (after.exit_code, after.text.strip()) == (0, "alive")
    [admitted] = task.admit([ToolResult(call_id="later", tool="t", content=payload("later"))])
    assert admitted.offloaded
    assert task.exec("sql", 'SELECT count(*) AS n FROM "later"').text.split() == ["n", "400"]


MEMORY_HOG = """
blocks = []
for i in range(40):  # 2.5 GB in 64 MB blocks, each written (zero-filled), over the 1 GB limit
    blocks.append(bytearray(64 * 1024 * 1024))
    print(i, flush=True)
print("allocated all")
"""


def test_the_memory_limit_holds_and_the_task_survives(task: Task) -> None:
    [admitted] = task.admit([ToolResult(call_id="before", tool="t", content=payload("before"))])
    assert admitted.offloaded
    result = task.exec("python", MEMORY_HOG, timeout=60)
    assert "allocated all" not in result.text
    assert result.exit_code != 0
    # Reported as what it was, at once: not a timeout (gVisor ends the whole sandbox and
    # leaves the exec's connection open; the host notices the sandbox stopped).
    assert result.oom_killed and not result.timed_out, result.stderr
    after = task.exec("sh", "echo alive")
    assert (after.exit_code, after.text.strip()) == (0, "alive")
    assert task.exec("sql", 'SELECT count(*) AS n FROM "before"').text.split() == ["n", "400"]


def test_an_oom_docker_records_after_the_exit_is_still_reported(
    task: Task, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Docker sets State.OOMKilled only if it hears of the OOM before the exit; under gVisor
    # the exit came first once (in a loaded run here), and the OOM was reported as a plain
    # stop. Replayed by hiding the record: the "oom" event Docker logs still tells.
    api = task.harness.backend.client.api  # type: ignore[attr-defined]
    inspect = api.inspect_container

    def without_oom_record(*args: Any, **kwargs: Any) -> Any:
        attrs = inspect(*args, **kwargs)
        attrs["State"]["OOMKilled"] = False
        return attrs

    monkeypatch.setattr(api, "inspect_container", without_oom_record)
    result = task.exec("python", MEMORY_HOG, timeout=60)
    assert result.exit_code != 0 and "allocated all" not in result.text
    assert result.oom_killed and not result.timed_out, result.stderr


def test_a_query_beside_a_memory_hog_is_answered_or_reported_stopped_not_timed_out(
    task: Task,
) -> None:
    # Under runc the memory limit kills the hog alone and the query (about 5 s) answers.
    # gVisor ends the whole sandbox and leaves the query's connection open: the host
    # notices the stop and reports it (or, had the connection ended, runs the read-only
    # query again), where the query used to wait out its timeout.
    [admitted] = task.admit([ToolResult(call_id="before", tool="t", content=payload("before"))])
    assert admitted.offloaded
    assert task.exec("sql", "SELECT 1").exit_code == 0  # the engine runs
    query = "SELECT count(DISTINCT i % 1000003) AS n FROM range(300000000) t(i)"
    with ThreadPoolExecutor(1) as pool:
        # 60 s: the query takes about 5 s alone, several times that beside other test
        # workers; a connection left waiting would still end timed out, at 60 s.
        querying = pool.submit(task.exec, "sql", query, timeout=60)
        time.sleep(1.5)  # the query is running
        hog = task.exec("python", MEMORY_HOG, timeout=60)
        sql = querying.result()
    assert hog.oom_killed and not hog.timed_out, hog.stderr
    assert not sql.timed_out, sql.stderr
    if "the sandbox stopped" in sql.stderr:
        assert sql.exit_code == 137 and sql.oom_killed
    else:
        assert (sql.exit_code, sql.text.split()) == (0, ["n", "1000003"]), sql.stderr
    assert task.exec("sql", 'SELECT count(*) AS n FROM "before"').text.split() == ["n", "400"]


CPU_SPINNERS = """
import time
from multiprocessing import Process

def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass

spinners = [Process(target=spin, args=(3,)) for _ in range(2)]
for p in spinners:
    p.start()
for p in spinners:
    p.join()
"""


def test_two_busy_processes_get_one_cpu_between_them(task: Task, docker_client: Any) -> None:
    # The machine has two cores; the sandbox's limit is one CPU. Measured on the host, from
    # the container's cgroup (gVisor's own accounting inside the sandbox overstated it
    # under load: 1.73 once). Load elsewhere can only lower the share, never raise it.
    task.exec("sh", "true")  # the container runs
    [container] = docker_client.containers.list(filters=task_filters(task))

    def cpu_seconds() -> float:
        stats = container.stats(stream=False, one_shot=True)
        return float(stats["cpu_stats"]["cpu_usage"]["total_usage"]) / 1e9

    used, started = cpu_seconds(), time.monotonic()
    result = task.exec("python", CPU_SPINNERS, timeout=60)
    share = (cpu_seconds() - used) / (time.monotonic() - started)
    assert result.exit_code == 0, result.stderr
    assert share <= 1.25, share


def test_a_script_cannot_write_into_the_container_log(task: Task, docker_client: Any) -> None:
    # The container's log is PID 1's output, capped by Docker; a script (another uid)
    # cannot open PID 1's stdout to flood it.
    result = task.exec("sh", "echo flood > /proc/1/fd/1 && echo wrote", timeout=10)
    assert "wrote" not in result.text and result.exit_code != 0
    [container] = docker_client.containers.list(filters=task_filters(task))
    log = container.attrs["HostConfig"]["LogConfig"]
    assert log["Type"] == "json-file" and log["Config"]["max-size"] == "1m"


ESCAPES = """
setsid sh -c 'touch /sandbox/work/escaped-setsid; exec sleep 300' &
nohup sh -c 'touch /sandbox/work/escaped-nohup; exec sleep 301' >/dev/null 2>&1 &
( sh -c 'touch /sandbox/work/escaped-subshell; exec sleep 302' & )
python3 -c '
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("/sandbox/work/escaped-double-fork", "w").close()
        time.sleep(303)
    os._exit(0)
'
cd /sandbox/work
until [ -e escaped-setsid ] && [ -e escaped-nohup ] && [ -e escaped-subshell ] \\
    && [ -e escaped-double-fork ]; do sleep 0.05; done
sleep 60
"""


def test_a_script_that_outlives_its_timeout_is_killed_with_its_children(task: Task) -> None:
    # The script waits for its four escapes to start, then outlives its timeout; the
    # timeout leaves a loaded machine (gVisor beside two other workers) time to start them.
    for _ in range(2):
        task.exec("sh", "true")
        before = container_id(task)
        result = task.exec("sh", ESCAPES, timeout=6)
        assert result.timed_out
        assert result.exit_code != 0
        escaped = task.exec("sh", "cd /sandbox/work && echo escaped-*").text.split()
        if container_id(task) == before:
            break
        # The sandbox was restarted after the timeout (outcome.py): by the host, when the
        # runner's kill had not closed the output by its last deadline, or, seen under
        # gVisor in CI (exit 124), after a sandbox that stopped once the runner had swept,
        # which the next exec found and restarted. That empties its tmpfs, and the
        # escapes' files with it, so this run proves nothing: run it once more.
    else:
        pytest.fail(f"the sandbox was restarted after the timeout in both runs: {result}")
    assert escaped == [  # every escape started: their absence below means they were killed
        "escaped-double-fork",
        "escaped-nohup",
        "escaped-setsid",
        "escaped-subshell",
    ], f"not every escape started within the 6 s timeout (load-dependent): {result}"
    assert script_leftovers(task) == []


def container_id(task: Task) -> str:
    """The id of the container the task's calls run in now (a restart of a pool slot's
    makes a new one; of a task's own, restarts it: its StartedAt changes)."""
    container = task.harness.backend.container(task.storage)  # type: ignore[attr-defined]
    container.reload()
    return f"{container.id} {container.attrs['State']['StartedAt']}"


def test_a_plain_sleep_past_its_timeout_is_killed(task: Task) -> None:
    result = task.exec("sh", "sleep 60", timeout=1)
    assert result.timed_out
    assert script_leftovers(task) == []


def test_the_host_never_follows_a_planted_symlink(task: Task, tmp_path: Path) -> None:
    target = tmp_path / "host-secret.txt"
    target.write_text("keep me")
    folder = tmp_path / "host-folder"
    folder.mkdir()
    (folder / "inside.txt").write_text("keep me too")
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    assert admitted.artifact is not None
    planted = task.exec(
        "sh",
        f"ln -s {target} /sandbox/work/file-link && ln -s {folder} /sandbox/work/dir-link"
        f" && ln -s / /sandbox/work/root-link && mkdir /sandbox/work/sub"
        f" && ln -s {target} /sandbox/work/sub/nested-link && cd /sandbox/work && ls",
    )
    assert planted.exit_code == 0, planted.stderr
    assert [row.name for row in task.artifacts()] == [admitted.artifact.name]
    task.delete("c1")  # deleting its derived copies walks the work folder
    root = task.storage.root
    task.close(delete=True)
    assert not root.exists()
    assert target.read_text() == "keep me"
    assert (folder / "inside.txt").read_text() == "keep me too"


def test_a_print_flood_is_bounded_and_the_harness_survives(task: Task, harness: Harness) -> None:
    assert isinstance(harness.backend, DockerBackend)
    cap = harness.backend.options.max_output_bytes
    flood = 50 * 1024 * 1024
    result = task.exec(
        "python",
        f"import sys\nline = b'y' * 1023 + b'\\n'\nfor _ in range({flood // 1024}):\n"
        "    sys.stdout.buffer.write(line)\n"
        "    sys.stderr.buffer.write(line[:256])\n",
        timeout=60,
    )
    assert result.exit_code == 0, result.stderr
    assert result.offloaded and result.artifact is not None
    assert len(result.text) < 10_000
    assert len(result.stderr) < 10_000  # 12 MB of stderr, bounded to its head and tail
    stored = result.artifact.host_path.stat().st_size
    assert stored <= cap + OUTPUT_TAIL_BYTES + 1024
    after = task.exec("sh", "echo alive")
    assert after.text.strip() == "alive"


def test_the_container_exposes_nothing_of_the_host(task: Task, harness: Harness) -> None:
    assert isinstance(harness.backend, DockerBackend)
    found = probe(
        task,
        """
import json, os
sockets = ["/var/run/docker.sock", "/run/docker.sock", "/run/containerd/containerd.sock"]
mounts = open("/proc/self/mountinfo").read()
print(json.dumps({"present": [s for s in sockets if os.path.exists(s)],
                  "mentioned": [s for s in ("docker.sock", "containerd") if s in mounts]}))
""",
    )
    assert found == {"present": [], "mentioned": []}
    container = harness.backend.container(task.storage)
    container.reload()
    attrs = container.attrs
    mounts = attrs["Mounts"]
    assert {m["Source"] for m in mounts} == mount_sources(task), mounts
    assert all(m["Type"] == "bind" for m in mounts)
    assert {m["Destination"]: m["RW"] for m in mounts} == {
        "/sandbox/offload": False,
        "/sandbox/cache": True,
    }
    host = attrs["HostConfig"]
    assert sorted(host["Tmpfs"]) == ["/sandbox/outputs", "/sandbox/run", "/sandbox/work", "/tmp"]
    assert all("size=" in options for options in host["Tmpfs"].values())
    assert not host.get("PortBindings") and not attrs["NetworkSettings"].get("Ports")
    assert host["NetworkMode"] == "none"
    assert not host["Privileged"] and not host.get("CapAdd") and host["CapDrop"] == ["ALL"]
    assert host["ReadonlyRootfs"] and "no-new-privileges" in host["SecurityOpt"]
    assert not host.get("Devices") and host["PidMode"] in ("", "private")
    assert host["PidsLimit"] > 0 and host["Memory"] > 0
    labels = container.labels
    # A task's own container names the task; a slot the task adopted names only its slot.
    slot = pool.adopted(harness.settings.home, task.storage)
    assert (labels.get(LABEL_TASK), labels.get(LABEL_SLOT)) == (
        (None, slot) if slot else (task.id, None)
    )
    assert labels[LABEL_OWNER]
    assert datetime.fromisoformat(labels[LABEL_EXPIRES]) > datetime.now(UTC)


HOSTILE_SQL = [
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/sandbox/work/../../etc/passwd')",
    "SELECT * FROM read_text('/proc/self/environ')",
    "COPY (SELECT 1 AS x) TO '/tmp/out.csv'",
    "COPY (SELECT 1 AS x) TO '/sandbox/cache/out.csv'",
    "COPY (SELECT 1 AS x) TO '/sandbox/offload/out.csv'",
    "COPY (SELECT 1 AS x) TO '/sandbox/work/../cache/out.csv'",
    "ATTACH '/sandbox/cache/evil.duckdb' AS evil",
    "SET enable_external_access = true",
    "SET allowed_directories = ['/']",
    "SET lock_configuration = false",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SELECT * FROM read_text('https://example.com/')",
]


def test_hostile_sql_is_refused(task: Task) -> None:
    for sql in HOSTILE_SQL:
        result = task.exec("sql", sql)
        assert result.exit_code != 0, (sql, result.text)
        assert "root:" not in result.text, sql
    assert not (task.storage.cache / "out.csv").exists()
    allowed = task.exec("sql", "COPY (SELECT 1 AS x) TO '/sandbox/work/out.csv'")
    assert allowed.exit_code == 0, allowed.stderr  # the refusals above are not a broken engine
    assert task.exec("sh", "cat /sandbox/work/out.csv").text.split() == ["x", "1"]


SWAP_DIR_FOR_SYMLINK = """
cd /sandbox/work
end=$(( $(date +%s) + 20 ))
while [ ! -e stop ] && [ $(date +%s) -lt $end ]; do
    mkdir -p sub.d && cp /tmp/known sub.d/copy && rm -f sub && mv sub.d sub
    sleep 0.01
    mv sub sub.d && ln -s {target} sub
    sleep 0.01
done
"""


def test_deleting_an_artifact_never_follows_a_symlink_swapped_into_work(
    task: Task, tmp_path: Path
) -> None:
    """Deleting an artifact also deletes its copies in /sandbox/work; a script that swaps a
    folder there for a symlink between the deletion's listing and its unlink must not make
    it delete a file outside the task (here one whose bytes the script knows)."""
    known = "".join(f"line {i} of a host file whose bytes are public\n" for i in range(800))
    victim = tmp_path / "host-folder" / "copy"
    victim.parent.mkdir()
    victim.write_text(known)
    [admitted] = task.admit([ToolResult(call_id="known", tool="t", content=known)])
    assert admitted.artifact is not None
    # Same-size decoys are hashed before sub/copy, which widens the window for the swap.
    prepared = task.exec(
        "python",
        f"data = open({admitted.artifact.path!r}, 'rb').read()\n"
        "open('/tmp/known', 'wb').write(data)\n"
        "for i in range(300):\n"
        "    open(f'/sandbox/work/decoy-{i}', 'wb').write(b'#' + data[1:])\n",
    )
    assert prepared.exit_code == 0, prepared.stderr
    with ThreadPoolExecutor(1) as pool:
        swapping = pool.submit(
            task.exec, "sh", SWAP_DIR_FOR_SYMLINK.format(target=victim.parent), timeout=30
        )
        try:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and victim.exists():
                # Files vanishing under the walk may fail one deletion: not what this tests.
                with contextlib.suppress(OSError, SpillboxError):
                    task.delete("known")
                task.admit([ToolResult(call_id="known", tool="t", content=known)])
        finally:
            task.exec("sh", "touch /sandbox/work/stop")
        # A deletion kills every script before it walks (test_attacks_deletion.py): the
        # swapper ends at the first one that finds it running, or runs out its loop.
        assert swapping.result().exit_code in (0, 137)
    assert victim.exists(), "the host followed a symlink planted in work/ and deleted a host file"
    assert victim.read_text() == known


def test_a_detached_child_of_a_finished_script_does_not_outlive_the_exec(task: Task) -> None:
    result = task.exec("sh", "nohup sleep 300 >/dev/null 2>&1 & echo started", timeout=2)
    assert (result.exit_code, result.text.strip()) == (0, "started")
    assert script_leftovers(task) == []


IMPERSONATOR = """
import subprocess
# Two processes leave the script's group with setsid; one names itself like the runner, so
# that a sweep that counts running scripts by their command line thinks one still runs.
for argv0, seconds in (("/opt/spillbox/run.sh", "300"), ("sleep", "301")):
    subprocess.Popen(
        ["python3", "-c", f"import os; os.execv('/bin/sleep', [{argv0!r}, {seconds!r}])"],
        start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
print("spawned")
"""


def test_a_process_posing_as_the_runner_does_not_escape_the_sweep(task: Task) -> None:
    result = task.exec("python", IMPERSONATOR, timeout=10)
    assert (result.exit_code, result.text.strip()) == (0, "spawned"), result.stderr
    assert script_leftovers(task) == []
