"""The file commands a model types first work in the sandbox under runc and under gVisor.

Debian bookworm's runsc (20221219) rejects statx's AT_NO_AUTOMOUNT flag, which coreutils' ls
and stat pass: `ls /sandbox/offload` failed there with "Invalid argument". The image preloads
statx_compat.so, which retries without the flag on that error only.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import test_attacks
from test_attacks import payload

from spillbox import Task, ToolResult

pytestmark = pytest.mark.docker

harness = test_attacks.harness
"""A docker harness, under runc and again under gVisor."""
task = test_attacks.task

SHELL = """
set -e
cd /sandbox/offload
name=$(ls /sandbox/offload)
echo "ls: $name"
ls -la /tmp >/dev/null && echo "ls -la: ok"
ls / | grep -qx sandbox && echo "ls /: ok"
echo "stat: $(stat -c %s "$name")"
echo "find: $(find /sandbox/offload -type f)"
echo "du: $(du -b "$name" | cut -f1)"
echo "wc: $(wc -c < "$name")"
echo "head: $(head -c 12 "$name")"
echo "cat: $(cat "$name" | sha256sum | cut -d' ' -f1)"
cp "$name" /sandbox/work/copy
mv /sandbox/work/copy /sandbox/work/moved
echo "cp mv: $(sha256sum < /sandbox/work/moved | cut -d' ' -f1)"
rm /sandbox/work/moved
test ! -e /sandbox/work/moved && echo "rm: ok"
"""

PYTHON = """
import json, os, pathlib
entries = {entry.name: entry.stat().st_size for entry in os.scandir("/sandbox/offload")}
paths = {path.name: len(path.read_bytes()) for path in pathlib.Path("/sandbox/offload").iterdir()}
sizes = {path.name: path.stat().st_size for path in pathlib.Path("/sandbox/offload").glob("*")}
print(json.dumps({"scandir": entries, "pathlib": paths, "stat": sizes}))
"""


def offload(task: Task) -> bytes:
    """Offload one payload and return its bytes as stored."""
    content = payload("files")
    [admitted] = task.admit([ToolResult(call_id="files", tool="t", content=content)])
    assert admitted.offloaded
    return content.encode()


def test_coreutils_file_commands_work(task: Task) -> None:
    data = offload(task)
    result = task.exec("sh", SHELL)
    assert result.exit_code == 0, result.stderr + result.text
    lines = dict(line.split(": ", 1) for line in result.text.strip().splitlines())
    name = lines["ls"]
    digest = hashlib.sha256(data).hexdigest()
    assert lines == {
        "ls": name,
        "ls -la": "ok",
        "ls /": "ok",
        "stat": str(len(data)),
        "find": f"/sandbox/offload/{name}",
        "du": str(len(data)),
        "wc": str(len(data)),
        "head": data[:12].decode(),
        "cat": digest,
        "cp mv": digest,
        "rm": "ok",
    }


def test_python_scandir_and_pathlib_work(task: Task) -> None:
    data = offload(task)
    result = task.exec("python", PYTHON)
    assert result.exit_code == 0, result.stderr
    found = json.loads(result.text)
    [name] = found["scandir"]
    assert found == {kind: {name: len(data)} for kind in ("scandir", "pathlib", "stat")}
