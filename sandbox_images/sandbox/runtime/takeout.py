"""Files that leave the sandbox: what a script leaves in /sandbox/outputs, taken after each
call, and the matplotlib figures a script or cell leaves open, saved there first.

    python3 -S takeout.py collect MAX_FILES MAX_FILE_BYTES

is what the host execs, as the engine uid (no script can kill or steer it), when a call
ended with the folder not empty. It writes frames on stdout (wire.py), as the fork server's
relay does: FILE a file taken (its name in UTF-8, a newline, its bytes), NOTE one line about
an entry not taken. Every entry is removed
afterwards, taken or not, so the next call starts with an empty folder.

Only regular files directly in the folder are taken, each read through its own descriptor
(no symbolic link followed, a FIFO never waited on, a device never opened), with one link
(a hard link would be the same bytes twice), a printable UTF-8 name, at most MAX_FILE_BYTES
(a file that grows past that while read is not taken), and at most MAX_FILES per call. The
files of one call hold at most the folder's own size together: a sparse file takes no room
in the folder, yet reads (and would be stored) whole.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys

import wire

OUTPUTS = "/sandbox/outputs"
MAX_NOTES = 20
"""Notes per call; past them one line counts the rest."""
READ_CHUNK = 1 << 20


def waiting() -> bool:
    """Whether the folder has anything in it (the relays ask this after each call)."""
    try:
        with os.scandir(OUTPUTS) as entries:
            return next(entries, None) is not None
    except FileNotFoundError:
        return False
    except OSError:
        return True  # a script made it unreadable: collect says so, call after call


def save_figures() -> None:
    """Save each open matplotlib figure as figure-N.png in the folder, then close them all,
    as a notebook shows a cell's figures once. Nothing if the code never imported pyplot."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        for number in pyplot.get_fignums():
            name = f"figure-{number}.png"
            n = 1
            while os.path.lexists(os.path.join(OUTPUTS, name)):
                n += 1
                name = f"figure-{number}-{n}.png"
            pyplot.figure(number).savefig(os.path.join(OUTPUTS, name), format="png")
    finally:
        pyplot.close("all")


def configure_matplotlib() -> None:
    """No display, and a config folder of this uid's own (the image's is read-only, and
    /tmp is shared by the script and session uids)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("MPLCONFIGDIR", f"/tmp/matplotlib-{os.getuid()}")


def collect(max_files: int, max_file_bytes: int) -> int:
    out = sys.stdout.buffer
    folder = os.fsencode(OUTPUTS)
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        wire.frame(out, wire.NOTE, f"the output folder could not be listed: {e.strerror}")
        return 1
    notes: list[str] = []
    taken = 0
    room = _folder_bytes(folder)
    for name in names:
        path = os.path.join(folder, name)
        if taken >= max_files:
            notes.append(f"{_shown(name)}: not taken, over {max_files} files in one call")
        else:
            limit, over = max_file_bytes, f"over the {max_file_bytes}-byte cap per file"
            if room < max_file_bytes:
                limit, over = room, f"over the {room} bytes left of the folder's size this call"
            data, why = _take(path, name, limit, over)
            if data is None:
                notes.append(f"{_shown(name)}: not taken, {why}")
            else:
                wire.frame(out, wire.FILE, name + b"\n" + data)
                taken += 1
                room -= len(data)
        failed = _remove(path)
        if failed:
            notes.append(f"{_shown(name)}: could not be removed ({failed})")
    for note in notes[:MAX_NOTES]:
        wire.frame(out, wire.NOTE, note)
    if len(notes) > MAX_NOTES:
        wire.frame(out, wire.NOTE, f"and {len(notes) - MAX_NOTES} more entries not taken")
    return 0


def _folder_bytes(folder: bytes) -> int:
    """The folder's size cap (its tmpfs's size): what the files of one call may hold."""
    try:
        found = os.statvfs(folder)
    except OSError:
        return 0
    return found.f_blocks * found.f_frsize


def _take(path: bytes, name: bytes, limit: int, over: str) -> tuple[bytes | None, str]:
    """The file's bytes, or None and why it is not taken (over: why a size past limit is)."""
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return None, "its name is not UTF-8"
    if not text.isprintable():
        return None, "its name has control characters"
    try:
        seen = os.lstat(path)
    except OSError as e:
        return None, f"it could not be read ({e.strerror})"
    why = _refused(seen, limit, over)
    if why:
        return None, why
    try:
        # O_NONBLOCK: swapped for a FIFO since lstat, the open still does not wait.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return None, f"it could not be opened ({e.strerror})"
    try:
        opened = os.fstat(fd)
        why = _refused(opened, limit, over)
        if why or (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            return None, why or "it was replaced while it was read"
        data = bytearray()
        while len(data) <= limit:
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                return bytes(data), ""
            data += chunk
        return None, f"it grew while it was read, {over}"
    finally:
        os.close(fd)


def _refused(seen: os.stat_result, limit: int, over: str) -> str:
    mode = seen.st_mode
    if stat.S_ISLNK(mode):
        return "a symbolic link (links are not followed)"
    if stat.S_ISDIR(mode):
        return "a folder (only files directly in /sandbox/outputs are taken)"
    if not stat.S_ISREG(mode):
        return "not a regular file (a FIFO, socket or device is never read)"
    if seen.st_nlink != 1:
        return "a hard link (a file with another name is not taken)"
    if seen.st_size > limit:
        return f"{seen.st_size} bytes, {over}"
    return ""


def _remove(path: bytes) -> str:
    """Remove an entry (a folder with what it holds, links not followed); why not, if not."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return ""
    except FileNotFoundError:
        return ""
    except OSError as e:
        return e.strerror or str(e)


def _shown(name: bytes) -> str:
    """A name as a note shows it: printable, bounded."""
    text = ascii(os.fsdecode(name)) if not _printable(name) else os.fsdecode(name)
    return text if len(text) <= 120 else text[:117] + "..."


def _printable(name: bytes) -> bool:
    try:
        return name.decode("utf-8").isprintable()
    except UnicodeDecodeError:
        return False


if __name__ == "__main__":
    if sys.argv[1:2] != ["collect"] or len(sys.argv) != 4:
        sys.exit("usage: takeout.py collect MAX_FILES MAX_FILE_BYTES")
    sys.exit(collect(int(sys.argv[2]), int(sys.argv[3])))
