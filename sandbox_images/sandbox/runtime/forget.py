"""Deletes what a uid's processes may have kept of a payload that is being deleted:
python3 forget.py scripts|session SINCE SHA256 SIZE

The host runs it once as the script uid ("scripts") and once as the session uid ("session"),
after it removed the payload from /sandbox/offload. First it kills every other process of
its uid, until it holds the uid's lock: no script, cell, fork server or session (nor one
posing as them) is left to hold the bytes in memory, and none starts while it works (a
fork server waits for this lock before it serves; a session call holds the session's lock).
Then, in every folder of the container its uid can write (each a size-capped tmpfs:
/sandbox/work, /sandbox/outputs, /tmp, /dev/shm; the session's /sandbox/run), it deletes
every entry changed at or after SINCE (epoch seconds: a script may have converted the
payload, and nothing tells which payload a script read) and every regular file that holds
exactly the payload's bytes. (System V IPC and POSIX message queues, which outlive
processes, cannot be made: the container's IPC limits are 0.) Change times
(ctime) are used, which no script can set back. The walk never follows a link, and runs as
the uid whose files it deletes: whatever a script planted can lead it nowhere the script
could not go itself. Exits 0 once done; the host runs it again if it did not.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import stat
import sys
import time

FOLDERS = ("/sandbox/work", "/sandbox/outputs", "/tmp", "/dev/shm")
RUN = "/sandbox/run"
SCRIPTS_LOCK = "/opt/spillbox/forget.py"
"""The script uid's lock: this file (read-only; a lock needs no write). Held exclusively
while forgetting; a fork server takes it shared before it serves."""
SESSION_LOCK = f"{RUN}/python.lock"
"""The session's call lock (session.py): held, no session call runs."""
SESSION_KEEPS = (SESSION_LOCK, f"{RUN}/python.started")
"""Kept (emptied): the lock that calls wait on, and the mark that tells the next call its
session's names are gone."""
LOCK_SECONDS = 30.0


def holds(name: str, folder: int, info: os.stat_result, sha256: str, size: int) -> bool:
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        return False
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(fd, "rb") as f:
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == sha256


def forget(top: str, since: float, sha256: str, size: int, keep: tuple[str, ...] = ()) -> int:
    removed = 0
    for path, dirs, files, folder in os.fwalk(top, topdown=False, follow_symlinks=False):
        for name in files + dirs:
            try:
                info = os.stat(name, dir_fd=folder, follow_symlinks=False)
                if os.path.join(path, name) in keep and stat.S_ISREG(info.st_mode):
                    kept = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
                    os.ftruncate(kept, 0)
                    os.close(kept)
                    continue
                if stat.S_ISDIR(info.st_mode):
                    if info.st_ctime >= since or top == RUN:
                        os.rmdir(name, dir_fd=folder)  # only if emptied above
                elif (
                    top == RUN or info.st_ctime >= since or holds(name, folder, info, sha256, size)
                ):
                    os.unlink(name, dir_fd=folder)
                else:
                    continue
                removed += 1
            except OSError:
                continue  # changed, gone, not empty, or another uid's
    return removed


def hold_alone(lock_path: str, create: bool) -> int:
    """Kill every other process of this uid until this one holds the lock; its fd."""
    lock = os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
    deadline = time.monotonic() + LOCK_SECONDS
    while True:
        _kill_others()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    _kill_others()  # any that started between the last kill and the lock
    return lock


def _kill_others() -> None:
    try:
        os.kill(-1, signal.SIGKILL)  # every process of this uid but this one
    except ProcessLookupError:
        pass  # none


def main(role: str, since: float, sha256: str, size: int) -> int:
    if role == "session":
        lock = hold_alone(SESSION_LOCK, create=True)
        folders, keep = (*FOLDERS, RUN), SESSION_KEEPS
    else:
        lock = hold_alone(SCRIPTS_LOCK, create=False)
        folders, keep = FOLDERS, ()
    removed = sum(forget(top, since, sha256, size, keep) for top in folders)
    os.close(lock)
    print(removed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
