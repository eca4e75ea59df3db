"""Deletes what scripts may have derived from a payload that is being deleted:
python3 forget.py SINCE SHA256 SIZE

In /sandbox/work and /tmp (the container's writable folders, both size-capped tmpfs) it
deletes every entry changed at or after SINCE (epoch seconds: a script may have converted
the payload, and nothing tells which payload a script read) and every regular file that
holds exactly the payload's bytes. Change times (ctime) are used, which no script can set
back. Runs as the script uid, inside the container: whatever a script planted (a symlink,
a folder swapped for one) can lead it nowhere the script could not go itself, and the walk
never follows a link.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys

FOLDERS = ("/sandbox/work", "/tmp")


def holds(name: str, folder: int, info: os.stat_result, sha256: str, size: int) -> bool:
    if not stat.S_ISREG(info.st_mode) or info.st_size != size:
        return False
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(fd, "rb") as f:
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == sha256


def forget(since: float, sha256: str, size: int) -> int:
    removed = 0
    for top in FOLDERS:
        for _, dirs, files, folder in os.fwalk(top, topdown=False, follow_symlinks=False):
            for name in files + dirs:
                try:
                    info = os.stat(name, dir_fd=folder, follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        if info.st_ctime >= since:
                            os.rmdir(name, dir_fd=folder)  # only if emptied above
                    elif info.st_ctime >= since or holds(name, folder, info, sha256, size):
                        os.unlink(name, dir_fd=folder)
                    else:
                        continue
                    removed += 1
                except OSError:
                    continue  # changed, gone, or not empty
    return removed


if __name__ == "__main__":
    print(forget(float(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
