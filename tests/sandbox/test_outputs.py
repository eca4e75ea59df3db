"""Attacks through /sandbox/outputs, the folder whose files leave the sandbox after each call
(takeout.py in the image, sandbox/docker/takeout.py on the host), each asserting that the
attack fails: links, FIFOs, devices, sockets, growing, sparse and huge files, hostile names,
thousands of files, folders, unreadable files and folder modes, the quota, another task.

For each: the host stores nothing but regular files the task wrote (under the task's own
offload folder, within its quota), reads nothing a link points at, never blocks (every call
returns well before its own timeout), and the model gets a note for whatever was not taken;
the folder is left empty for the next call (or the leftover is named again).

Every test runs as a stateless script (the fork server) and as a cell of the task's Python
session, under runc and again under gVisor where the engine has it.
"""

from __future__ import annotations

import ast
import json
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import test_attacks
from test_attacks import payload, script_leftovers, storage_bytes, task_filters

from spillbox import ExecResult, Harness, Retention, RetentionError, Task, ToolResult
from spillbox.sandbox.docker import DockerBackend
from spillbox.sandbox.docker.takeout import MAX_OUTPUT_FILE_BYTES, MAX_OUTPUT_FILES

pytestmark = pytest.mark.docker

harness = test_attacks.harness
"""A docker harness, under runc and again under gVisor."""
task = test_attacks.task

TIMEOUT = 60.0
"""Each call's own timeout: a call that blocked on an entry would run into it."""
NOT_TAKEN = re.compile(r"^(?P<name>.+): not taken, (?P<why>.+)$")
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@pytest.fixture(params=["script", "session"])
def mode(request: pytest.FixtureRequest) -> str:
    """Where the attacker's Python runs: a stateless script, or a cell of the session."""
    return str(request.param)


def run(task: Task, mode: str, code: str, timeout: float = TIMEOUT) -> ExecResult:
    """Run the attacker's Python; the call returns, in time, and its notes are plain lines."""
    started = time.monotonic()
    result = task.exec("python", code, timeout=timeout, session=mode == "session")
    # Generous: the take after the script had its own 60 s, so a take that blocked on an
    # entry would show here (or as a note that it gave up).
    assert time.monotonic() - started < timeout, "the call (or the take after it) blocked"
    assert not result.timed_out, result.stderr
    assert all(note.isprintable() and len(note) < 400 for note in result.file_notes), (
        result.file_notes
    )
    for artifact in result.files:
        assert_in_offload(task, artifact.host_path)
    return result


def printed(result: ExecResult) -> Any:
    assert result.exit_code == 0, result.stderr
    return json.loads(result.text)


def not_taken(result: ExecResult) -> dict[str, str]:
    """The entries the notes name as not taken, and why."""
    found = {}
    for note in result.file_notes:
        matched = NOT_TAKEN.match(note)
        if matched:
            found[matched["name"]] = matched["why"]
    return found


def assert_in_offload(task: Task, host_path: Path) -> None:
    """A stored output is a plain file right in the task's offload folder on the host."""
    offload = task.storage.offload.resolve()
    assert not host_path.is_symlink(), host_path
    assert host_path.resolve().parent == offload, (host_path, offload)
    assert PLAIN_NAME.fullmatch(host_path.name) and len(host_path.name.encode()) <= 255


def outputs_left(task: Task) -> list[str]:
    """What /sandbox/outputs holds now (the listing runs before this call's own take)."""
    # Not ls: gVisor's statx refuses coreutils' flags (EINVAL).
    listed = task.exec("python", "import os\nprint(repr(sorted(os.listdir('/sandbox/outputs'))))")
    assert listed.exit_code == 0, listed.stderr
    found: list[str] = ast.literal_eval(listed.text)
    return found


def stored_bytes(task: Task) -> bytes:
    """Every byte the task stored on the host, joined: for searching markers in."""
    return b"".join(
        path.read_bytes() for path in sorted(task.storage.root.rglob("*")) if path.is_file()
    )


def test_symlinks_are_not_followed(task: Task, harness: Harness, mode: str, tmp_path: Path) -> None:
    """Links to a host-looking path, to another task's payload (its host path and its path in
    the sandbox), to /proc, to the task's own payload: none is followed nor stored."""
    host_secret = tmp_path / "host-secret.txt"
    host_marker = f"HOST-SECRET-{uuid.uuid4().hex}"
    host_secret.write_text(host_marker)
    other = harness.task("other")
    try:
        other_marker = f"OTHER-SECRET-{uuid.uuid4().hex}"
        [theirs] = other.admit([ToolResult(call_id="s", tool="t", content=payload(other_marker))])
        [mine] = task.admit([ToolResult(call_id="c1", tool="t", content=payload("mine"))])
        assert theirs.artifact is not None and mine.artifact is not None
        before = [row.name for row in task.artifacts()]
        links = {
            "passwd": "/etc/passwd",
            "environ": "/proc/self/environ",
            "init-environ": "/proc/1/environ",
            "host-file.txt": str(host_secret),
            "other-host": str(theirs.artifact.host_path),
            "other-offload.json": f"/sandbox/offload/{theirs.artifact.name}",
            "own.json": mine.artifact.path,
            "relative.json": f"../offload/{mine.artifact.name}",
            "root": "/",
            "dangling": "/nowhere",
            "loop": "loop",
        }
        result = run(
            task,
            mode,
            f"import os\nfor name, target in {links!r}.items():\n"
            "    os.symlink(target, '/sandbox/outputs/' + name)\n",
        )
        assert result.exit_code == 0, result.stderr
        assert result.files == () and result.images == ()
        assert not_taken(result) == dict.fromkeys(links, "a symbolic link (links are not followed)")
        assert [row.name for row in task.artifacts()] == before
        assert outputs_left(task) == []
        everything = stored_bytes(task)
        for marker in (host_marker, other_marker, "root:x:0:0", "PATH="):
            assert marker.encode() not in everything, marker
        assert host_secret.read_text() == host_marker
        assert theirs.artifact.host_path.read_text() == payload(other_marker)
    finally:
        other.close(delete=True)


HARD_LINKS = """
import errno, json, os
out = {}
with open("/sandbox/outputs/original.txt", "w") as f:
    f.write("original")
os.link("/sandbox/outputs/original.txt", "/sandbox/outputs/second.txt")
for source in ("/sandbox/work/w.txt", "/tmp/t.txt", "/sandbox/offload/c1.json"):
    if not source.startswith("/sandbox/offload"):
        with open(source, "w") as f:
            f.write("elsewhere")
    try:
        os.link(source, "/sandbox/outputs/from-" + source.split("/")[2])
        out[source] = "linked"
    except OSError as e:
        out[source] = errno.errorcode[e.errno]
print(json.dumps(out))
"""


def test_hard_links_are_not_taken_and_cannot_cross_mounts(task: Task, mode: str) -> None:
    task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    before = [row.name for row in task.artifacts()]
    result = run(task, mode, HARD_LINKS)
    # Work, /tmp and the payloads are other mounts: a link from any of them fails.
    assert printed(result) == {
        "/sandbox/work/w.txt": "EXDEV",
        "/tmp/t.txt": "EXDEV",
        "/sandbox/offload/c1.json": "EXDEV",
    }
    # The first name is not taken, and removed: the second then has one link left, and is
    # taken (in name order). The bytes are stored once at most.
    why = "a hard link (a file with another name is not taken)"
    assert not_taken(result) == {"original.txt": why}
    assert [(a.name, a.host_path.read_text()) for a in result.files] == [("second.txt", "original")]
    assert [row.name for row in task.artifacts()] == [*before, "second.txt"]
    assert outputs_left(task) == []


SPECIAL_FILES = """
import errno, json, os, socket, stat, subprocess
out = {}
os.mkfifo("/sandbox/outputs/fifo")
# A writer waits on this FIFO for a reader that never comes (killed when the call ends).
subprocess.Popen(["sh", "-c", "echo x > /sandbox/outputs/fifo"])
nodes = {"null": (stat.S_IFCHR | 0o666, os.makedev(1, 3)),
         "disk": (stat.S_IFBLK | 0o600, os.makedev(8, 0)),
         "whiteout": (stat.S_IFCHR, 0)}
for name, (kind, device) in nodes.items():
    try:
        os.mknod("/sandbox/outputs/" + name, kind, device)
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
        continue
    try:
        os.close(os.open("/sandbox/outputs/" + name, os.O_RDONLY | os.O_NONBLOCK))
        out[name] = "made, opened"
    except OSError as e:
        out[name] = "made, " + errno.errorcode[e.errno]
listener = socket.socket(socket.AF_UNIX)
listener.bind("/sandbox/outputs/sock")
listener.listen()
print(json.dumps(out))
"""


def test_fifos_sockets_and_devices_are_never_opened(
    task: Task, harness: Harness, mode: str
) -> None:
    """The call returns though a writer waits on the FIFO; no entry is opened by the
    collector, so none is stored; each is named."""
    result = run(task, mode, SPECIAL_FILES)
    made = printed(result)
    nodes = [name for name, outcome in made.items() if outcome.startswith("made")]
    assert isinstance(harness.backend, DockerBackend)
    if harness.backend.options.runtime == test_attacks.GVISOR:
        # gVisor lets any uid make a device node in its tmpfs, and opens it despite nodev:
        # a device of gVisor's own kernel (1:3 is its null device), never the host's.
        assert made["disk"] == "made, ENXIO", made
    else:
        # No CAP_MKNOD (and the folder is nodev): no device node can be made. Only an
        # overlay whiteout (a character device 0:0) is anyone's to make since Linux 5.8,
        # and it opens nothing.
        assert made.pop("whiteout") in ("EPERM", "made, ENXIO", "made, EACCES"), made
        assert made == {"null": "EPERM", "disk": "EPERM"}
    why = "not a regular file (a FIFO, socket or device is never read)"
    expected = {"fifo": why, "sock": why}
    expected.update(dict.fromkeys(nodes, why))
    assert not_taken(result) == expected
    assert result.files == ()
    assert outputs_left(task) == []
    assert task.artifacts() == []


GROW_IN_A_THREAD = """
import os, threading
stop = threading.Event()
big = open("/sandbox/outputs/big.bin", "wb", buffering=0)
big.write(bytes({big_mib} << 20))
lines = open("/sandbox/outputs/lines.txt", "wb", buffering=0)
def grow():
    n = 0
    while not stop.is_set():
        try:
            lines.write(f"line {{n}}\\n".encode())
            n += 1
            big.write(bytes(1 << 10))
        except OSError:
            stop.wait(0.01)  # the folder is full
grower = threading.Thread(target=grow, daemon=True)
grower.start()
while os.fstat(lines.fileno()).st_size < 20_000:
    stop.wait(0.001)
"""

GROW_IN_THE_BACKGROUND = """
import subprocess, time, os
code = '''
import os
big = open("/sandbox/outputs/big.bin", "wb", buffering=0)
big.write(bytes({big_mib} << 20))
n = 0
while True:
    try:
        with open("/sandbox/outputs/lines.txt", "ab") as lines:  # made again if taken
            lines.write(f"line {{n}}\\\\n".encode())
        n += 1
        big.write(bytes(1 << 10))
    except OSError:
        pass
'''
subprocess.Popen(["python3", "-c", code], start_new_session=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not os.path.exists("/sandbox/outputs/lines.txt") or (
        os.stat("/sandbox/outputs/lines.txt").st_size < 20_000):
    time.sleep(0.001)
"""


def test_files_growing_while_taken_are_bounded(task: Task, harness: Harness, mode: str) -> None:
    """A writer keeps going after the call: in a session a thread of the session (it lives
    on), in a script a process that left the script's group (the sweep kills it before the
    take). A file over the cap per file is not taken; one under it is taken as a prefix of
    what was written, never past the cap."""
    big_mib = MAX_OUTPUT_FILE_BYTES // (1 << 20) + 8
    code = GROW_IN_A_THREAD if mode == "session" else GROW_IN_THE_BACKGROUND
    result = run(task, mode, code.format(big_mib=big_mib))
    assert result.exit_code == 0, result.stderr
    assert "big.bin" in not_taken(result), result.file_notes
    assert "over the" in not_taken(result)["big.bin"]
    if "lines.txt" in not_taken(result):
        assert "grew" in not_taken(result)["lines.txt"]
    else:
        [taken] = result.files
        data = taken.host_path.read_bytes()
        assert 20_000 <= len(data) <= MAX_OUTPUT_FILE_BYTES
        written = "".join(f"line {n}\n" for n in range(data.count(b"\n") + 1)).encode()
        assert written.startswith(data)
    assert storage_bytes(task.storage.root) < 2 * MAX_OUTPUT_FILE_BYTES
    if mode == "session":
        stopped = run(task, mode, "stop.set()\ngrower.join()\nbig.close()\nlines.close()")
        assert stopped.exit_code == 0, stopped.stderr
    else:
        assert script_leftovers(task) == []  # the writer was swept with its script
    assert outputs_left(task) == []
    assert outputs_left(task) == []  # and nothing writes there any more


NAMES = [
    b"ctl\x01.txt",
    b"new\nline.txt",
    b"tab\t.txt",
    b"esc\x1b[31m.txt",
    b"\xff\xfe.bin",
    "\u202etxt.exe".encode(),
    "zero\u200bwidth.txt".encode(),
    b"a" * 255,
    ("\u00e9" * 127).encode(),
    b"..\\..\\evil.txt",
    b"a\\b.txt",
    b"...",
    b".hidden",
    b"-rf",
    b" lead.txt",
    b"c1.json",
]
REFUSED = 7
"""The first names: control characters, not UTF-8, or not printable (a bidi override)."""


def test_hostile_names_are_refused_or_stored_under_a_plain_name(task: Task, mode: str) -> None:
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    assert admitted.artifact is not None and admitted.artifact.name == "c1.json"
    result = run(
        task,
        mode,
        f"import os\nfor i, name in enumerate({NAMES!r}):\n"
        "    with open(b'/sandbox/outputs/' + name, 'wb') as f:\n"
        "        f.write(b'content-%d' % i)\n",
    )
    assert result.exit_code == 0, result.stderr
    refused = not_taken(result)
    assert len(refused) == REFUSED, result.file_notes
    assert all(why.startswith("its name") for why in refused.values()), refused
    stored = {a.host_path.read_bytes(): a for a in result.files}
    assert sorted(stored) == sorted(b"content-%d" % i for i in range(REFUSED, len(NAMES)))
    for artifact in result.files:
        assert artifact.path == f"/sandbox/offload/{artifact.name}"
        assert artifact.host_path == task.storage.offload / artifact.name
    # Taken under another name than the payload's own: the payload is as it was, and the
    # payload's name, path and call id still find the payload, not the script's file.
    assert stored[b"content-%d" % NAMES.index(b"c1.json")].name != "c1.json"
    assert admitted.artifact.host_path.read_text() == payload("c1")
    for ref in ("c1", "c1.json", admitted.artifact.path):
        assert task.artifact(ref).name == "c1.json", ref
    assert task.exec("jq", "length", artifact=admitted.artifact.path).text == "400\n"
    assert sorted(p.name for p in task.storage.offload.iterdir()) == sorted(
        ["c1.json", *(a.name for a in result.files)]
    )
    assert outputs_left(task) == []


def test_output_files_with_a_payloads_stem_get_ids_of_their_own(task: Task, mode: str) -> None:
    """The stem of a stored file is its artifact id: c1.txt beside the payload c1.json must
    not take over the payload's record (which left c1.json stored, unrecorded, outside the
    quota's count), nor its table."""
    task.admit([ToolResult(call_id="c1", tool="t", content=payload("c1"))])
    result = run(
        task,
        mode,
        "for name in ('c1', 'c1.txt', 'c1.csv', 'c1-2.json'):\n"
        "    open('/sandbox/outputs/' + name, 'w').write('a\\n' + name + '\\n')\n",
    )
    assert result.exit_code == 0, result.stderr
    ids = [row.artifact_id for row in task.artifacts()]
    assert len(ids) == len(set(ids)) == 5, ids
    assert task.artifact("c1").name == "c1.json"
    # Every stored file is recorded: none is left outside the catalog and the quota.
    assert sorted(row.name for row in task.artifacts()) == sorted(
        path.name for path in task.storage.offload.iterdir()
    )
    query = task.exec("sql", 'SELECT count(*) AS n FROM "c1"')
    assert query.text.split() == ["n", "400"], query.stderr


def test_thousands_of_files(task: Task, mode: str) -> None:
    count = 5000
    result = run(
        task,
        mode,
        f"for i in range({count}):\n"
        "    with open(f'/sandbox/outputs/f{i:05d}.txt', 'w') as f:\n"
        "        f.write(str(i))\n",
    )
    assert result.exit_code == 0, result.stderr
    assert sorted(a.name for a in result.files) == [f"f{i:05d}.txt" for i in range(32)]
    assert len(result.files) == MAX_OUTPUT_FILES
    named = not_taken(result)
    assert all(why == "over 32 files in one call" for why in named.values()), named
    more = count - MAX_OUTPUT_FILES - len(named)
    assert result.file_notes[-1] == f"and {more} more entries not taken"
    assert len(task.artifacts()) == MAX_OUTPUT_FILES
    assert outputs_left(task) == []


FILL_OUTPUTS = """
import errno, json
out = {{"written_mib": 0, "error": None}}
try:
    with open("/sandbox/outputs/huge.bin", "wb", buffering=0) as f:
        for _ in range({over}):
            f.write(bytes(1 << 20))
            out["written_mib"] += 1
except OSError as e:
    out["error"] = errno.errorcode[e.errno]
    out["message"] = e.strerror
print(json.dumps(out))
"""


def outputs_cap(harness: Harness) -> int:
    assert isinstance(harness.backend, DockerBackend)
    size = harness.backend.options.outputs_size
    assert size.endswith("m")
    return int(size[:-1]) << 20


def test_one_huge_file_fills_the_folder_not_the_hosts_disk(
    task: Task, harness: Harness, mode: str, docker_client: Any
) -> None:
    cap = outputs_cap(harness)
    found = printed(run(task, mode, FILL_OUTPUTS.format(over=2 * (cap >> 20))))
    assert (found["error"], found["message"]) == ("ENOSPC", "No space left on device"), found
    assert (cap >> 20) - 8 <= found["written_mib"] <= cap >> 20
    [listed] = docker_client.api.containers(size=True, filters=task_filters(task))
    assert (listed.get("SizeRw") or 0) < 1 << 20
    assert storage_bytes(task.storage.root) < 1 << 20
    assert task.artifacts() == []
    # The take emptied the folder: the next call has the whole cap again.
    again = run(task, mode, "open('/sandbox/outputs/small.txt', 'w').write('small')")
    assert [a.host_path.read_text() for a in again.files] == ["small"]


def test_one_huge_file_is_not_taken(task: Task, harness: Harness, mode: str) -> None:
    result = run(task, mode, FILL_OUTPUTS.format(over=2 * (outputs_cap(harness) >> 20)))
    why = not_taken(result)["huge.bin"]
    assert why.endswith(f"bytes, over the {MAX_OUTPUT_FILE_BYTES}-byte cap per file"), why
    assert result.files == () and outputs_left(task) == []


SPARSE = """
for i in range({count}):
    with open(f"/sandbox/outputs/sparse-{{i}}.bin", "wb") as f:
        f.truncate({size} - 1)
        f.write(bytes([i + 1]))  # each file its own bytes: not stored once for all
"""


def test_sparse_files_count_whole_against_the_folders_size(
    task: Task, harness: Harness, mode: str
) -> None:
    """A sparse file takes no room in the folder yet reads whole: the files of one call are
    held to the folder's size together, or a script could have the host store (and hold in
    memory) 32 files of 32 MiB each from a 64 MB folder."""
    cap = outputs_cap(harness)
    size = MAX_OUTPUT_FILE_BYTES - (1 << 20)
    result = run(task, mode, SPARSE.format(count=8, size=size))
    assert result.exit_code == 0, result.stderr
    assert sum(a.bytes for a in result.files) <= cap
    assert len(result.files) == cap // size
    refused = not_taken(result)
    assert len(refused) == 8 - len(result.files)
    assert all("left of the folder's size" in why for why in refused.values()), refused
    assert storage_bytes(task.storage.offload) <= cap
    assert outputs_left(task) == []


def test_the_quota_holds_for_output_files(harness: Harness, mode: str) -> None:
    refusing = harness.task("refusing", Retention(max_bytes=300_000, on_quota="refuse"))
    evicting = harness.task("evicting", Retention(max_bytes=300_000, on_quota="evict"))
    write = (
        "import os\nfor name in ('a.bin', 'b.bin'):\n"
        "    open('/sandbox/outputs/' + name, 'wb').write(os.urandom(150_000))\n"
    )
    try:
        [old] = refusing.admit([ToolResult(call_id="old", tool="t", content=payload("old"))])
        assert old.offloaded
        refused = run(refusing, mode, write)
        assert [a.name for a in refused.files] == ["a.bin"]
        [note] = refused.file_notes
        assert note.startswith("b.bin: not stored: ") and "quota" in note, note
        assert sum(row.bytes for row in refusing.artifacts()) <= 300_000
        assert storage_bytes(refusing.storage.offload) <= 300_000
        assert outputs_left(refusing) == []

        [old] = evicting.admit([ToolResult(call_id="old", tool="t", content=payload("old"))])
        assert old.offloaded
        evicted = run(evicting, mode, write)
        assert sorted(a.name for a in evicted.files) == ["a.bin", "b.bin"]
        assert evicted.file_notes == ()
        with pytest.raises(RetentionError):
            evicting.artifact("old")  # the oldest went, as for any offload
        assert sum(row.bytes for row in evicting.artifacts()) <= 300_000
        assert storage_bytes(evicting.storage.offload) <= 300_000
    finally:
        refusing.close(delete=True)
        evicting.close(delete=True)


def test_a_folder_is_not_taken_and_removed(task: Task, mode: str) -> None:
    result = run(
        task,
        mode,
        "import os\nos.makedirs('/sandbox/outputs/sub/deeper')\n"
        "open('/sandbox/outputs/sub/a.txt', 'w').write('a')\n"
        "open('/sandbox/outputs/sub/deeper/b.txt', 'w').write('b')\n"
        "os.symlink('/etc', '/sandbox/outputs/sub/etc')\n"
        "open('/sandbox/outputs/top.txt', 'w').write('top')\n",
    )
    assert result.exit_code == 0, result.stderr
    assert [a.host_path.read_text() for a in result.files] == ["top"]
    assert not_taken(result) == {
        "sub": "a folder (only files directly in /sandbox/outputs are taken)"
    }
    assert outputs_left(task) == []
    assert task.exec("sh", "test -e /etc/passwd").exit_code == 0  # the link was not followed


def test_the_files_of_one_task_never_reach_another(harness: Harness, mode: str) -> None:
    alpha, bravo = harness.task("alpha"), harness.task("bravo")
    markers = {alpha.id: f"ALPHA-{uuid.uuid4().hex}", bravo.id: f"BRAVO-{uuid.uuid4().hex}"}

    def write(one: Task) -> ExecResult:
        return run(
            one,
            mode,
            "import matplotlib.pyplot as plt\n"
            f"open('/sandbox/outputs/report.txt', 'w').write({markers[one.id]!r})\n"
            f"plt.title({markers[one.id]!r})\nplt.plot([1, 2])\n",
        )

    try:
        with ThreadPoolExecutor(2) as pool:
            results = dict(zip((alpha, bravo), pool.map(write, (alpha, bravo)), strict=True))
        for one, result in results.items():
            assert result.exit_code == 0, result.stderr
            assert sorted(a.name for a in result.files) == ["figure-1.png", "report.txt"]
            report = next(a for a in result.files if a.name == "report.txt")
            assert report.host_path.read_text() == markers[one.id]
            assert all(a.task_id == one.id for a in result.files)
            assert all(a.host_path.parent == one.storage.offload for a in result.files)
            theirs = next(m for task_id, m in markers.items() if task_id != one.id)
            assert theirs.encode() not in stored_bytes(one)
            assert sorted(row.name for row in one.artifacts()) == ["figure-1.png", "report.txt"]
    finally:
        alpha.close(delete=True)
        bravo.close(delete=True)


UNREADABLE = """
import os
for name, mode in (("zero.txt", 0o000), ("private.txt", 0o600), ("shared.txt", 0o660)):
    with open("/sandbox/outputs/" + name, "w") as f:
        f.write(name)
    os.chmod("/sandbox/outputs/" + name, mode)
os.mkdir("/sandbox/outputs/locked")
open("/sandbox/outputs/locked/inside.txt", "w").write("inside")
os.chmod("/sandbox/outputs/locked", 0o000)
"""


def test_files_the_collector_cannot_read_are_named_and_removed(task: Task, mode: str) -> None:
    """The collector runs as another uid (the engine's), which the script can shut out of a
    file or a folder of its own: a note says so, and a leftover is named again after each
    call until the script opens it up."""
    result = run(task, mode, UNREADABLE)
    assert result.exit_code == 0, result.stderr
    assert [a.host_path.read_text() for a in result.files] == ["shared.txt"]
    assert not_taken(result) == {
        "zero.txt": "it could not be opened (Permission denied)",
        "private.txt": "it could not be opened (Permission denied)",
        "locked": "a folder (only files directly in /sandbox/outputs are taken)",
    }
    assert "locked: could not be removed (Permission denied)" in result.file_notes
    again = run(task, mode, "1")
    assert again.file_notes == (
        "locked: not taken, a folder (only files directly in /sandbox/outputs are taken)",
        "locked: could not be removed (Permission denied)",
    )
    opened = run(task, mode, "import os\nos.chmod('/sandbox/outputs/locked', 0o770)")
    assert opened.file_notes == (
        "locked: not taken, a folder (only files directly in /sandbox/outputs are taken)",
    )
    assert outputs_left(task) == []


def test_no_script_can_lock_the_folder_or_make_it_sticky(task: Task, mode: str) -> None:
    """The folder is the engine uid's (the collector's), open to the scripts' group: neither
    a script nor the session can shut the collector out or make the folder sticky (so that
    the collector could not remove what it took)."""
    for bits in ("0o700", "0o1770", "0o777"):
        refused = run(task, mode, f"import os\nos.chmod('/sandbox/outputs', {bits})")
        assert "PermissionError" in refused.stderr, refused.stderr
    written = run(task, mode, "open('/sandbox/outputs/kept.txt', 'w').write('kept')")
    assert [a.host_path.read_text() for a in written.files] == ["kept"]
    assert written.file_notes == ()
    assert outputs_left(task) == []


SWAPPER = """
import os
def swap(stopped):
    # x is by turns a regular file, a link to a host-looking path, and a FIFO.
    os.chdir("/sandbox/outputs")
    while not stopped():
        for made, make in ((".r", lambda: open(".r", "w").write("regular")),
                           (".l", lambda: os.symlink("/etc/passwd", ".l")),
                           (".f", lambda: os.mkfifo(".f"))):
            try:
                make()
                os.replace(made, "x")
            except OSError:
                pass  # the collector removed it meanwhile
"""


def test_entries_swapped_while_taken_are_never_followed(task: Task, mode: str) -> None:
    """A writer swaps a regular file for a link and a FIFO under the same name while the
    collector takes the folder: a session's thread, or (the sweep ends a script's leftovers
    before its take) a concurrent script of the same task. Whatever is taken is the regular
    file's bytes (as far as written); the calls return."""
    takes: list[ExecResult] = []
    if mode == "session":
        started = run(
            task,
            mode,
            SWAPPER + "import threading\nstop = threading.Event()\n"
            "swapper = threading.Thread(target=swap, args=(stop.is_set,), daemon=True)\n"
            "swapper.start()\n",
        )
        assert started.exit_code == 0, started.stderr
        takes += [started, *(run(task, mode, "pass") for _ in range(5))]
        assert run(task, mode, "stop.set()\nswapper.join()").exit_code == 0
    else:
        loop = SWAPPER + (
            "open('/sandbox/work/started', 'w').close()\n"
            "swap(lambda: os.path.exists('/sandbox/work/stop'))\n"
        )
        with ThreadPoolExecutor(1) as pool:
            swapping = pool.submit(task.exec, "python", loop, timeout=TIMEOUT)
            try:
                while task.exec("sh", "test -e /sandbox/work/started").exit_code != 0:
                    assert not swapping.done(), swapping.result().stderr
                takes += [run(task, mode, "open('/sandbox/outputs/a.txt', 'w').write('a')")]
                takes += [run(task, mode, "pass") for _ in range(4)]
            finally:
                task.exec("sh", "touch /sandbox/work/stop")
            takes.append(swapping.result())
    for result in takes:
        assert not result.timed_out, result.stderr
        for artifact in result.files:
            # Taken as far as written when read (a prefix), and never through a link.
            data = artifact.host_path.read_bytes()
            assert b"regular".startswith(data) or data == b"a", (artifact.name, data)
    assert b"root:x:0:0" not in stored_bytes(task)
    outputs_left(task)  # this call takes what the writer left
    assert outputs_left(task) == []
