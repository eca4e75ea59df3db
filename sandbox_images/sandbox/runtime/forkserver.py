"""Fast starts for stateless scripts: a fork server per sandbox, with Python's heavy modules
imported once, and relays that the host keeps open between calls.

One file, two roles:

    python3 forkserver.py relay   what a host process execs once and keeps, as the engine uid
                                  (a script can neither kill it nor read its requests). It
                                  reads one request line at a time on stdin, has the fork
                                  server start the script, and writes the script's output
                                  back as frames on stdout, then the script's end.
    python3 forkserver.py serve   the fork server, as the script uid, started by the host when
                                  a relay finds none. It starts one process per script
                                  (python: a child forked from it, with duckdb, pyarrow and
                                  jq imported and DuckDB's default connection open, forked
                                  ahead when it can; sh: spawned), applies its timeout and
                                  sweeps what it left.

Request:  {"lang": "python"|"sh", "code": "...", "timeout": 30, "nonce": "..."} (the nonce
          stays in the relay: its END carries it back, so the host knows the end is this
          call's)
Frames (wire.py): NO_SERVER: no fork server answers (the host starts one; the relay waits
          for it); STARTED: the script started; STDOUT and STDERR: its output; END: its end,
          {"exit_code": 0, "oom_killed": false, "outputs": false}.

What each script gets: its own process group, which the timeout signals whole (TERM, then
KILL 2 s later; exit 124 as `timeout` gives); when the script ends, what it left in its
group is killed, and if no other script runs (of any host process: they all go through this
server), every process of the script uid but the server (kill(-1) spares its caller), which
catches one that left its group with setsid. Whether the memory limit killed something is
read from the cgroup's oom_kill counter before and after.

A script can kill the fork server (it runs as the same uid): the relay then reports that the
runner ended (exit 137), and the next call starts a new server. What it cannot do is take
the server's place: a relay speaks only to a server of the script uid that Docker entered
(its parent is 0, which no process in the sandbox can make), told by the credentials the
kernel vouches for on the server's first message (SCM_CREDENTIALS: gVisor's SO_PEERCRED
names the asking end), before it sends a script; otherwise it has the host start one,
which first kills every other process of the uid. Nor can it reach into the server: the
server (and every python child it forks, until it execs) is not dumpable, so no process of
its uid can trace it or open its memory or descriptors in /proc. The server answers only
relays (the engine uid), and waits for a deletion in progress (forget.py) before it serves.
No script can reach the relays (another uid) or the host.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import sys
import time

import noipc
import takeout
import wire

SCRIPT_UID = 10001
ENGINE_UID = 10002
"""The relays' uid: the only clients the fork server answers."""
PR_SET_DUMPABLE = 4
HELLO = b"H"
"""The server's first message on each connection, which carries its credentials."""
HELLO_SECONDS = 10.0
"""How long a relay waits for the server's first message: a server just started sends it
once its imports are done (seconds, on a loaded machine)."""
ADDRESS = "\0spillbox-forkserver"
"""An abstract Unix socket: it lives in the container's own network namespace (no network:
a namespace of its own), so no file of it can be deleted, swapped or reached from outside."""
GRACE_SECONDS = 2.0
EXIT_TIMED_OUT = 124
EXIT_NOT_STARTED = 127
"""As a shell says of a command it could not run."""
START_SECONDS = 60.0
"""How long a relay waits for the fork server the host starts."""
RETELL_SECONDS = 5.0
"""How often a relay that still finds no server asks the host again (the server started
may have been killed by a deletion before it served)."""


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
    """A connection to the fork server; if none answers (or one that is not the server
    does), say so (the host starts one) and wait for it."""
    told_at: float | None = None
    deadline = time.monotonic() + START_SECONDS
    while True:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.connect(ADDRESS)
            if authentic(server):
                return server
        except OSError:
            pass
        server.close()
        now = time.monotonic()
        if now > deadline:
            raise RuntimeError(f"no fork server within {START_SECONDS:.0f} s")
        if told_at is None or now - told_at >= RETELL_SECONDS:
            wire.frame(out, wire.NO_SERVER, b"")
            told_at = now
        time.sleep(0.005)


CREDENTIALS = struct.Struct("3i")
"""struct ucred: pid, uid, gid."""


def send_vouched(sock: socket.socket, data: bytes) -> None:
    """Send data with this process's credentials, which the kernel checks (a process can
    claim no pid or uid but its own).

    Nothing more is sent once sendmsg took it all: sendall sends even an empty rest, and
    that fails (EPIPE) if the other end has closed since, as the fork server does the
    moment it has answered a script that cannot start.
    """
    mine = CREDENTIALS.pack(os.getpid(), os.getuid(), os.getgid())
    sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, mine)])
    if sent < len(data):
        sock.sendall(data[sent:])


def receive_vouched(sock: socket.socket) -> tuple[bytes, int, int]:
    """The next data from sock, and the sender's pid and uid (-1 if it sent none)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    data, ancillary, _, _ = sock.recvmsg(1 << 16, socket.CMSG_SPACE(CREDENTIALS.size))
    # Off again: credentials on the next messages would crowd out the descriptors sent.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)
    for level, kind, body in ancillary:
        if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
            pid, uid, _ = CREDENTIALS.unpack(body[: CREDENTIALS.size])
            return data, pid, uid
    return data, -1, -1


def authentic(sock: socket.socket) -> bool:
    """Whether the listener at the other end is a fork server the host started, by its
    first message: of the script uid, and entered by Docker (parent 0; a script's
    processes have a parent in the sandbox)."""
    sock.settimeout(HELLO_SECONDS)  # one that never speaks is not the server
    hello, pid, uid = receive_vouched(sock)
    sock.settimeout(None)
    if hello != HELLO or uid != SCRIPT_UID:
        return False
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    return fields.get("PPid", "").strip() == "0"


def _relay_one(server: socket.socket, request: dict[str, object], out: object) -> None:
    import selectors

    before = oom_count()
    nonce = request.pop("nonce", None)
    send_vouched(server, (json.dumps(request) + "\n").encode())
    _, fds, _, _ = socket.recv_fds(server, 1, 2)
    wire.frame(out, wire.STARTED, b"")
    status: dict[str, object] = {"exit_code": 137}
    selector = selectors.DefaultSelector()
    for kind, fd in zip((wire.STDOUT, wire.STDERR), fds, strict=True):
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ, kind)
    selector.register(server, selectors.EVENT_READ, None)
    answer = bytearray()
    open_ends = 3
    while open_ends:
        for key, _ in selector.select():
            if key.data is None:
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
                    wire.frame(out, key.data, chunk)
                    continue
                os.close(key.fd)  # type: ignore[arg-type]
            selector.unregister(key.fileobj)
            open_ends -= 1
    status["oom_killed"] = oom_count() != before
    status["outputs"] = takeout.waiting()
    status["nonce"] = nonce
    wire.frame(out, wire.END, json.dumps(status))


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

    # Not dumpable: no process of the script uid can trace this server or a spare, nor
    # open their memory or descriptors in /proc.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    noipc.install()  # no script makes an IPC object that a deletion cannot reach
    takeout.configure_matplotlib()
    # What scripts write (into /sandbox/outputs too) is for the group: the engine uid, which
    # takes the output files, reads and removes them.
    os.umask(0o007)
    import jq  # noqa: F401 (imported once, here: each python child starts with it)

    listener = _listen()
    if listener is None:
        return  # another server serves
    running = Running()
    os.chdir("/sandbox/work")
    _prepare()
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(client, running), daemon=True).start()


def _listen() -> socket.socket | None:
    """The server's listener, once no deletion runs (forget.py holds its lock) and every
    other process of the uid is gone (one posing as the server holds the address); None if
    a server the host started already answers there."""
    from forget import SCRIPTS_LOCK

    lock = os.open(SCRIPTS_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with probe:
            try:
                probe.connect(ADDRESS)
                if authentic(probe):
                    return None
            except OSError:
                pass
        try:
            os.kill(-1, signal.SIGKILL)  # every process of the uid but this one
        except ProcessLookupError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for _ in range(200):  # the killed holder's socket closes as it is torn down
            try:
                listener.bind(ADDRESS)
                break
            except OSError:
                time.sleep(0.005)
        else:
            return None
        listener.listen(64)
        return listener
    finally:
        os.close(lock)


def _prepare() -> None:
    """Do once, here, what a python child would otherwise do first: import duckdb and
    pyarrow, create DuckDB's default connection (its database costs a process 40-70 ms) and
    run a first query, an Arrow result and a first pyarrow array through it (a few ms more).

    A child has only the thread that forked it, so the database runs no thread of its own
    to lose: threads=1 (a query runs on the thread that asks) and async_threads=0 (no I/O
    pool). The sandbox's one CPU gives a fresh process threads=1 anyway; a script given more
    can `SET threads = 2`. Nothing here is used again in the server, so no lock of it is
    held when a child is forked.
    """
    import duckdb
    import pyarrow

    duckdb.set_default_connection(
        duckdb.connect(":memory:", config={"threads": 1, "async_threads": 0})
    )
    duckdb.sql("SELECT 41 + 1").fetchall()
    duckdb.sql("SELECT 42 AS a").arrow()
    pyarrow.array([1, 2]).to_pylist()
    # A spawned sh gets only what is inheritable: make sure no library left an fd that is.
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.set_inheritable(int(name), False)
            except OSError:
                pass  # listdir's own, closed by now


Spare = tuple[int, socket.socket]
"""A python child forked ahead (its pid, and the socket it waits on for its script)."""


class Running:
    """How many scripts run now: the uid-wide sweep waits for the last, and no script starts
    while it runs (the lock). And the spare: a python child forked once no script runs, so
    the next python script does not wait for the fork (1-2 ms: this server's page tables,
    with duckdb and pyarrow loaded). A spare lives only while no script runs (the next
    script takes it), so no sweep kills it, and no script sees it among its processes.
    """

    def __init__(self) -> None:
        import threading

        self.count = 0
        self.lock = threading.Lock()
        self.spare: Spare | None = None

    def start(self) -> Spare | None:
        """Count a script in; the spare for it, if one is ready."""
        with self.lock:
            self.count += 1
            spare, self.spare = self.spare, None
            return spare

    def refill(self) -> None:
        """Fork the spare, if no script runs and there is none."""
        with self.lock:
            if self.count == 0 and self.spare is None:
                try:
                    self.spare = _fork_spare()
                except OSError:
                    pass  # the pids limit, still full of the last script's dying processes

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
        try:
            send_vouched(client, HELLO)
            line, _, uid = receive_vouched(client)
            if uid != ENGINE_UID:
                return  # a script, or a server starting that checks this one answers
            while not line.endswith(b"\n"):
                chunk = client.recv(1 << 16)
                if not chunk:
                    return
                line += chunk
        except OSError:
            return  # gone before it asked
        request = json.loads(line)
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        spare = running.start()
        started = _start(str(request["lang"]), str(request["code"]), out_write, err_write, spare)
        os.close(out_write)
        os.close(err_write)
        socket.send_fds(client, [b"F"], [out_read, err_read])
        os.close(out_read)
        os.close(err_read)
        exit_code = EXIT_NOT_STARTED
        if started is not None:
            exit_code = _wait(*started, float(request["timeout"]))
        running.end()
        try:
            client.sendall((json.dumps({"exit_code": exit_code}) + "\n").encode())
        except OSError:
            pass  # the relay is gone
    # Reaped once its end is out: a python child's memory takes milliseconds to tear down.
    if started is not None:
        os.waitpid(started[0], 0)
        if started[1] is not None:
            started[1].close()
    if request["lang"] != "sh":
        running.refill()  # the next python script's spare


def _start(
    lang: str, code: str, out: int, err: int, spare: Spare | None
) -> tuple[int, socket.socket | None] | None:
    """Start a script in a process group of its own, stdin at /dev/null, the pipes as its
    stdout and stderr; its pid and, for python, the socket on which it says its exit status;
    None when it could not start (said on its stderr).

    python runs in a child forked from this server (the spare, or one forked now), so it
    starts with this server's modules; sh is spawned (posix_spawn: the kernel copies none
    of this server's page tables, which a fork copies), with the signals Python ignores set
    back to default (`yes | head` ends as in a shell) and only fds 0-2 (every other fd here
    is close-on-exec).
    """
    if spare is not None and lang == "sh":  # it goes, so that none is left while sh runs
        _end_spare(spare[0])
    try:
        if lang != "sh":
            return _start_python(code, out, err, spare)
        pid = os.posix_spawn(
            "/bin/sh",
            ["sh", "-c", code],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out, 1),
                (os.POSIX_SPAWN_DUP2, err, 2),
            ],
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            setsigmask=(),
        )
        return pid, None
    except (OSError, ValueError) as e:  # the pids limit; sh: over 128 KB (E2BIG), a NUL byte
        os.write(err, f"{lang}: cannot start the script: {e}\n".encode())
        return None


def _start_python(code: str, out: int, err: int, spare: Spare | None) -> Spare:
    try:
        return _hand(spare or _fork_spare(), code, out, err)
    except OSError:  # the spare died before its script (a script killed it)
        return _hand(_fork_spare(), code, out, err)


def _wait(pid: int, said: socket.socket | None, timeout: float) -> int:
    """The script's exit code: TERM to its group at the timeout (124), KILL 2 s later.

    A python child says its exit status (on said) before its memory is torn down, which
    takes it milliseconds more; one that ends without saying (a crash, os._exit, an exec)
    is waited for. When it ends, what it left in its group is killed; it is not reaped here,
    so its pid, the group's id, cannot have been reused.
    """
    import threading

    ended = threading.Event()
    signalled: list[int] = []

    def watch() -> None:
        for signum, after in ((signal.SIGTERM, timeout), (signal.SIGKILL, GRACE_SECONDS)):
            if ended.wait(after):
                return
            signalled.append(signum)
            _killpg(pid, signum)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    exit_code = _said(said) if said is not None else None
    if exit_code is None:
        found = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        exited = found.si_code == os.CLD_EXITED
        exit_code = found.si_status % 256 if exited else 128 + found.si_status
    ended.set()
    watcher.join()
    _killpg(pid, signal.SIGKILL)
    if signalled:
        return EXIT_TIMED_OUT if signalled[-1] == signal.SIGTERM else 137
    return exit_code


def _said(said: socket.socket) -> int | None:
    """The exit status a python child says, one byte; None if it ends without."""
    try:
        status = said.recv(1)
    except OSError:
        return None
    return status[0] if status else None


def _killpg(pid: int, signum: int) -> None:
    """Signal the group of pid, a child not yet reaped (so its pid is not reused)."""
    try:
        os.killpg(pid, signum)
    except OSError:
        try:
            os.kill(pid, signum)  # a child yet to make its group (setsid)
        except OSError:
            pass


def _fork_spare() -> Spare:
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.detach()
        _spare(theirs)
    theirs.close()
    return pid, ours


def _hand(spare: Spare, code: str, out: int, err: int) -> Spare:
    """Give the spare its script and its stdout and stderr; OSError if it died (then
    reaped)."""
    pid, control = spare
    try:
        socket.send_fds(control, [b"F"], [out, err])
        control.sendall(code.encode("utf-8", "surrogatepass"))
        control.shutdown(socket.SHUT_WR)
    except OSError:
        control.close()
        _end_spare(pid)
        raise
    return spare


def _end_spare(pid: int) -> None:
    _killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _spare(control: socket.socket) -> None:
    """In the forked python child: a process group of its own, stdin at /dev/null, then it
    waits for its script and runs it with the pipes as stdout and stderr, and says its exit
    status on control. Ends without running anything if the server ends first."""
    try:
        me = os.getpid()
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        # Nothing else of the server's: not its listener, nor another script's connection
        # or pipes (a child forked meanwhile by another thread holds them until here).
        fd, limit = control.fileno(), os.sysconf("SC_OPEN_MAX")
        os.closerange(3, fd)
        os.closerange(fd + 1, limit)
        _, fds, _, _ = socket.recv_fds(control, 1, 2)
        if len(fds) != 2:
            os._exit(0)
        code = bytearray()
        while chunk := control.recv(1 << 16):
            code += chunk
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.closerange(3, fd)  # control stays (close-on-exec): the script's one other fd
        os.closerange(fd + 1, limit)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        status = _python(code.decode("utf-8", "surrogatepass")) % 256
        if os.getpid() == me:  # not a child the script forked that ran off its end
            _say(control, status)
        os._exit(status)
    except BaseException:
        os._exit(127)


def _say(control: socket.socket, status: int) -> None:
    """Close stdout and stderr (the relay has all the output now), then say the status.
    Whatever the script did to them or to control, the status it exits with stands."""
    for fd in (1, 2):
        try:
            os.close(fd)
        except OSError:
            pass  # the script closed it
    try:
        control.send(bytes([status]))
    except OSError:
        pass  # the server is gone, or the script closed it: the exit says it


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
        status = print_error(e, __file__)
    try:
        takeout.save_figures()  # the figures a script leaves open come back as images
    except Exception as e:
        status = status or print_error(e, __file__)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return status


def print_error(error: BaseException, server: str) -> int:
    """Print an error's traceback as `python3 -c` does, without the frames of the server
    file that ran the code (they are not the model's); exit status 1."""
    import traceback

    shown = traceback.TracebackException.from_exception(error)
    here = os.path.abspath(server)
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
