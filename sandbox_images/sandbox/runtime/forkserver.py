"""Fast starts for stateless scripts: a fork server per sandbox, with Python's heavy modules
imported once, and relays that the host keeps open between calls.

One file, two roles:

    python3 forkserver.py relay   what a host process execs once and keeps, as the engine uid
                                  (a script can neither kill it nor read its requests). It
                                  reads one request line at a time on stdin, has the fork
                                  server start the script, and writes the script's output
                                  back as frames on stdout, then the script's end.
    python3 forkserver.py serve   the fork server, as the script uid, started by the host when
                                  a relay finds none. It forks one child per script (python:
                                  the code runs in the child, duckdb, pyarrow and jq already
                                  imported; sh: the child execs sh), applies its timeout and
                                  sweeps what it left.

Request:  {"lang": "python"|"sh", "code": "...", "timeout": 30}
Frames:   one byte, four bytes of length, the data. b"N": no fork server answers (the host
          starts one; the relay waits for it); b"S": the script started; b"1" and b"2": its
          stdout and stderr; b"E": its end, {"exit_code": 0, "oom_killed": false}.

What each script gets: its own process group, which the timeout signals whole (TERM, then
KILL 2 s later; exit 124 as `timeout` gives); when the script ends, what it left in its
group is killed, and if no other script runs (of any host process: they all go through this
server), every process of the script uid but the server (kill(-1) spares its caller), which
catches one that left its group with setsid. Whether the memory limit killed something is
read from the cgroup's oom_kill counter before and after.

A script can kill the fork server (it runs as the same uid): the relay then reports that the
runner ended (exit 137), and the next call starts a new server. What it cannot do is reach
the relays (another uid) or the host.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import time

import takeout

ADDRESS = "\0spillbox-forkserver"
"""An abstract Unix socket: it lives in the container's own network namespace (no network:
a namespace of its own), so no file of it can be deleted, swapped or reached from outside."""
GRACE_SECONDS = 2.0
EXIT_TIMED_OUT = 124
START_SECONDS = 60.0
"""How long a relay waits for the fork server the host starts."""


# The relay


def relay() -> int:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        request = json.loads(line)
        server = _connect(out)
        with server:
            _relay_one(server, request, out)
    return 0


def _connect(out: object) -> socket.socket:
    """A connection to the fork server; if none answers, say so (the host starts one) and
    wait for it."""
    told = False
    deadline = time.monotonic() + START_SECONDS
    while True:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.connect(ADDRESS)
            return server
        except OSError:
            server.close()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no fork server within {START_SECONDS:.0f} s") from None
            if not told:
                _frame(out, b"N", b"")
                told = True
            time.sleep(0.005)


def _frame(out: object, kind: bytes, data: bytes) -> None:
    out.write(kind + struct.pack(">I", len(data)) + data)  # type: ignore[attr-defined]
    out.flush()  # type: ignore[attr-defined]


def _relay_one(server: socket.socket, request: dict[str, object], out: object) -> None:
    import selectors

    before = oom_count()
    server.sendall((json.dumps(request) + "\n").encode())
    _, fds, _, _ = socket.recv_fds(server, 1, 2)
    _frame(out, b"S", b"")
    status: dict[str, object] = {"exit_code": 137}
    selector = selectors.DefaultSelector()
    for kind, fd in zip((b"1", b"2"), fds, strict=True):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ, kind)
    selector.register(server, selectors.EVENT_READ, b"S")
    answer = bytearray()
    open_ends = 3
    while open_ends:
        for key, _ in selector.select():
            if key.data == b"S":
                chunk = server.recv(4096)
                answer += chunk
                if chunk:
                    continue
                if answer.endswith(b"\n"):
                    status = json.loads(answer)
            else:
                try:
                    chunk = os.read(key.fd, 1 << 16)  # type: ignore[arg-type]
                except BlockingIOError:
                    continue
                if chunk:
                    _frame(out, key.data, chunk)
                    continue
                os.close(key.fd)  # type: ignore[arg-type]
            selector.unregister(key.fileobj)
            open_ends -= 1
    status["oom_killed"] = oom_count() != before
    status["outputs"] = takeout.waiting()
    _frame(out, b"E", json.dumps(status).encode())


def oom_count() -> str:
    for events in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(events) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return value.strip()
        except OSError:
            continue
    return ""


# The fork server


def serve() -> None:
    import threading

    takeout.configure_matplotlib()
    # What scripts write (into /sandbox/outputs too) is for the group: the engine uid, which
    # takes the output files, reads and removes them.
    os.umask(0o007)
    import duckdb  # noqa: F401 (imported once, here: each python child starts with it)
    import jq  # noqa: F401
    import pyarrow  # noqa: F401

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(ADDRESS)
    except OSError:
        return  # another server took the address first: it serves
    listener.listen(64)
    running = Running()
    os.chdir("/sandbox/work")
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(client, running), daemon=True).start()


class Running:
    """How many scripts run now: the uid-wide sweep waits for the last, and no script starts
    while it runs (the lock)."""

    def __init__(self) -> None:
        import threading

        self.count = 0
        self.lock = threading.Lock()

    def start(self) -> None:
        with self.lock:
            self.count += 1

    def end(self) -> None:
        with self.lock:
            self.count -= 1
            if self.count == 0:
                try:
                    os.kill(-1, signal.SIGKILL)  # every process of the uid but this server
                except OSError:
                    pass


def _serve_one(client: socket.socket, running: Running) -> None:
    with client:
        line = client.makefile("rb").readline()
        request = json.loads(line)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        running.start()
        pid = os.fork()
        if pid == 0:
            os.close(out_read)
            os.close(err_read)
            _child(str(request["lang"]), str(request["code"]), out_write, err_write)
        os.close(out_write)
        os.close(err_write)
        socket.send_fds(client, [b"F"], [out_read, err_read])
        os.close(out_read)
        os.close(err_read)
        exit_code = _wait(pid, float(request["timeout"]))
        try:
            os.killpg(pid, signal.SIGKILL)  # what the script left in its group
        except OSError:
            pass
        running.end()
        try:
            client.sendall((json.dumps({"exit_code": exit_code}) + "\n").encode())
        except OSError:
            pass  # the relay is gone


def _wait(pid: int, timeout: float) -> int:
    """The child's exit code: TERM to its group at the timeout (124), KILL 2 s later."""
    started = time.monotonic()
    deadline = started + timeout
    signalled: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        now = time.monotonic()
        if signalled is None and now >= deadline:
            signalled = signal.SIGTERM
            _killpg(pid, signal.SIGTERM)
        elif signalled == signal.SIGTERM and now >= deadline + GRACE_SECONDS:
            signalled = signal.SIGKILL
            _killpg(pid, signal.SIGKILL)
        # Most scripts end within milliseconds: look often at first, then every 10 ms.
        time.sleep(0.0005 if now - started < 0.05 else 0.01)
    if signalled is not None:
        return EXIT_TIMED_OUT if signalled == signal.SIGTERM else 137
    return (
        os.waitstatus_to_exitcode(status) % 256
        if os.WIFEXITED(status)
        else 128 + (os.WTERMSIG(status))
    )


def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except OSError:
        pass


def _child(lang: str, code: str, out: int, err: int) -> None:
    """In the forked child: a process group of its own, the pipes as stdout and stderr."""
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        # Nothing else of the server's: not its listener, nor another script's connection
        # or pipes (a child forked meanwhile by another thread holds them until here).
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if lang == "sh":
            os.execv("/bin/sh", ["sh", "-c", code])
        os._exit(_python(code))
    except BaseException:
        os._exit(127)


def _python(code: str) -> int:
    sys.argv = ["-c"]
    sys.path[0] = ""  # as `python3 -c` has it: the working folder, not the server's
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(code, "<string>", "exec"), namespace)
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException as e:
        status = _print_error(e)
    try:
        takeout.save_figures()  # the figures a script leaves open come back as images
    except Exception as e:
        status = status or _print_error(e)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return status


def _print_error(error: BaseException) -> int:
    """Print an error as `python3 -c` does, without this server's own frame; status 1."""
    import traceback

    shown = traceback.TracebackException.from_exception(error)
    here = os.path.abspath(__file__)
    shown.stack = traceback.StackSummary.from_list(
        [frame for frame in shown.stack if frame.filename != here]
    )
    print("".join(shown.format()), end="", file=sys.stderr)
    return 1


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit(relay())
