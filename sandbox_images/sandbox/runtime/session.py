"""The task's Python session: one long-lived interpreter per sandbox, where the names a call
defines are there in the next, as in a notebook; duckdb, pyarrow and jq are imported once.

One file, two roles (as sqlserver.py has):

    python3 session.py run|reset TIMEOUT        the relay: what the host execs for each call,
                                                as the session uid, with one line on stdin,
                                                {"code": ..., "nonce": ...} (not in argv,
                                                which /proc shows every process). It takes
                                                the session's lock (calls run one at a time,
                                                in the order they came), starts the server
                                                when none answers (reset: a new one in any
                                                case), hands it its own stdout and stderr,
                                                interrupts the cell at TIMEOUT, and ends its
                                                stderr with the end line (END_MARK, the
                                                host's nonce, the OOM and outputs flags).
    python3 session.py serve                    the server: runs each cell in one namespace.

The session runs as its own uid (10003): a stateless script (uid 10001) can neither reach
its socket nor signal it, and the sweeps of the script uid do not end it. What a cell starts
in the background is killed when the cell ends: every process of the session uid but the
server and the relays (the processes Docker entered, whose parent is 0, which no process
inside can fake). A thread a cell leaves running is ended too (SystemExit raised in it); one
that does not end within THREAD_GRACE ends the session: a thread would write into later
cells' output and see their code. The relay is not dumpable (no cell can read its memory, so
none learns the nonce that makes its end line its own).

A timeout interrupts the cell as a notebook does (KeyboardInterrupt in the cell, and an
interrupt of the session's DuckDB connection): the session and its names are kept. A cell
that has not stopped INTERRUPT_GRACE seconds later is ended with its session, and the relay
says so. A server that died (a crash, the memory limit, os._exit) is replaced by a new,
empty one at the next call, which is told its names are gone.

The relay's exit code is the cell's: 0, 1 for an exception, SystemExit's code, 124 when it
was interrupted at its timeout, 137 when the session ended under it. Its stderr ends with
the end mark (and the OOM mark before it when the memory limit killed something), so the
host tells a relay that ended by itself from one cut under it (the sandbox died).
"""

from __future__ import annotations

# The relay, started for every call, imports only what it needs (and runs with -S, no
# site-packages): its start is most of a call's cost. The server imports the rest.
import fcntl
import json
import os
import signal
import socket
import sys
import time
from typing import Any

# Beside this file, as the relay is run (python3 -S):
import noipc
import takeout
from forkserver import oom_count, print_error

RUN = "/sandbox/run"
SOCKET = f"{RUN}/python.sock"
LOCK = f"{RUN}/python.lock"
LOG = f"{RUN}/python.log"
PID_FILE = f"{RUN}/python.pid"
STARTED = f"{RUN}/python.started"
"""Exists once a session has started in this container (a tmpfs: gone with it)."""
START_SECONDS = 60.0
INTERRUPT_GRACE = 2.0
"""How long an interrupted cell may take to stop before its session is ended."""
EXIT_INTERRUPTED = 124
EXIT_ENDED = 137
END_MARK = b"\x1espillbox:end "
"""The relay's last stderr line: this, the host's nonce, a space, {"oom_killed": bool,
"outputs": bool} (the cell left files in /sandbox/outputs for the host)."""
PR_SET_DUMPABLE = 4
THREAD_GRACE = 1.0
"""How long threads a cell left get to end after SystemExit is raised in them."""
SWEEP_ROUNDS = 20
LOST = (
    "spillbox: the Python session of this task had ended since its last call (a crash, the "
    "memory limit, a timeout the cell did not stop at, or a deletion): this call runs in a "
    "new, empty session; names defined before are gone"
)


# The relay


def relay(mode: str, timeout: float) -> int:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    noipc.install()  # nor a cell, through the session this relay starts
    request = json.loads(sys.stdin.buffer.readline())
    before = oom_count()
    try:
        status = _relay(mode, timeout, str(request["code"]))
    finally:
        sys.stdout.flush()
        flags = {"oom_killed": oom_count() != before, "outputs": takeout.waiting()}
        nonce = str(request["nonce"]).encode()
        os.write(2, END_MARK + nonce + b" " + json.dumps(flags).encode() + b"\n")
    return status


def _note(text: str) -> None:
    os.write(2, (text + "\n").encode())


def _relay(mode: str, timeout: float, code: str) -> int:
    deadline = time.monotonic() + timeout
    os.umask(0o077)
    with open(LOCK, "a") as lock:
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    _note(
                        f"spillbox: the Python session was busy with another call for all of "
                        f"this call's {timeout:g} s: nothing ran; run it again"
                    )
                    return EXIT_INTERRUPTED
                time.sleep(0.005)
        if mode == "reset":
            _end_server(forget=True)
            _note("spillbox: the Python session was reset: this call runs in a new, empty one")
        sock, lost = _connect_or_start()
        if lost:
            _note(LOST)
        with sock:
            return _call(sock, code, deadline, timeout)


class Lines:
    """Lines read from a socket that may time out (a file made of it cannot go on after a
    timeout): what came before the timeout is kept for the next read."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = bytearray()

    def line(self) -> bytes:
        """The next line, with its newline; what is left, without one, at the end."""
        while b"\n" not in self.pending:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                rest, self.pending = bytes(self.pending), bytearray()
                return rest
            self.pending += chunk
        line, _, rest = bytes(self.pending).partition(b"\n")
        self.pending = bytearray(rest)
        return line + b"\n"


def _call(sock: socket.socket, code: str, deadline: float, timeout: float) -> int:
    answers = Lines(sock)
    hello = json.loads(answers.line())
    request = (json.dumps({"code": code}) + "\n").encode()
    socket.send_fds(sock, [request[:1]], [1, 2])
    sock.sendall(request[1:])
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    interrupted = False
    while True:
        try:
            line = answers.line()
            break
        except TimeoutError:
            if interrupted:
                _end_server(int(hello["pid"]))
                _note(
                    f"spillbox: the cell did not stop within {INTERRUPT_GRACE:g} s of its "
                    f"interrupt at the {timeout:g} s timeout: the session was ended and its "
                    "names are gone; the next call starts a new one"
                )
                return EXIT_INTERRUPTED
            interrupted = True
            try:
                sock.sendall(b"interrupt\n")
            except OSError:
                pass  # the server is gone: the read below says so
            sock.settimeout(INTERRUPT_GRACE)
    if not line.endswith(b"\n"):
        _note(
            "spillbox: the Python session ended while this cell ran (it crashed, exited, or "
            "ran out of memory): its names are gone; the next call starts a new, empty one"
        )
        return EXIT_ENDED
    answer = json.loads(line)
    if answer.get("left"):
        _note(
            f"spillbox: the cell left {answer['left']} thread(s) running that did not stop "
            f"within {THREAD_GRACE:g} s (a thread would write into later cells' output): the "
            "session was ended and its names are gone; join threads before a cell ends"
        )
    if answer["interrupted"]:
        _note(
            f"spillbox: the cell was interrupted at its {timeout:g} s timeout; the session "
            "is kept, with the names defined before the interrupt"
        )
        return EXIT_INTERRUPTED
    return int(answer["exit_code"])


def _connect() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(SOCKET)
    except OSError:
        sock.close()
        raise
    return sock


def _connect_or_start() -> tuple[socket.socket, bool]:
    """A connection to the server, starting one if none answers; and whether an earlier
    session of this container was lost (so its names are gone)."""
    try:
        return _connect(), False
    except OSError:
        pass
    import subprocess

    lost = os.path.exists(STARTED)
    _end_server(forget=True)  # what is left of a dead one (a cell's children)
    with open(LOG, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own group: it outlives the relay
        )
    deadline = time.monotonic() + START_SECONDS
    while True:
        try:
            return _connect(), lost
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(f"the Python session could not start: {_log_tail()}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer within {START_SECONDS:.0f} s") from None
            time.sleep(0.005)


def _end_server(pid: int | None = None, forget: bool = False) -> None:
    """Kill the server (and every process a cell left). forget: as if none had run here
    (otherwise the next call is told that its session's names are gone)."""
    if pid is None:
        try:
            with open(PID_FILE) as f:
                pid = int(f.read())
        except (OSError, ValueError):
            pid = None
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # gone already
    sweep({os.getpid()})
    for path in (SOCKET, PID_FILE, *([STARTED] if forget else [])):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _log_tail() -> str:
    try:
        with open(LOG, "rb") as log:
            lines = log.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1] if lines else "no error message"


def sweep(spare: set[int]) -> None:
    """Kill every process of this uid but `spare` and those Docker entered (parent 0: the
    relays of calls waiting their turn), until none is left (a forking one makes more)."""
    me = os.getuid()
    for _ in range(SWEEP_ROUNDS):
        found = False
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in spare:
                continue
            try:
                with open(f"/proc/{name}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                uid, ppid = int(fields["Uid"].split()[0]), int(fields["PPid"])
            except (OSError, ValueError, KeyError):
                continue  # gone meanwhile
            if uid == me and ppid != 0 and fields["State"].split()[0] not in ("Z", "X"):
                found = True
                try:
                    os.kill(int(name), signal.SIGKILL)
                except OSError:
                    pass
        if not found:
            return


# The server


class Cell:
    """Whether a cell runs (an interrupt that comes after it ended is ignored), and whether
    it was interrupted."""

    running = False
    interrupted = False


def serve() -> None:
    import threading
    from functools import partial

    takeout.configure_matplotlib()
    import duckdb
    import jq
    import pyarrow

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sqlserver import LOADED, Loader

    # What the session writes into /sandbox/work is for the scripts' group too.
    os.umask(0o007)
    con = duckdb.default_connection()
    con.execute(f"CREATE TABLE IF NOT EXISTS {LOADED} (name VARCHAR PRIMARY KEY, stamp VARCHAR)")
    namespace: dict[str, Any] = {
        "__name__": "__main__",
        "__builtins__": __builtins__,
        "duckdb": duckdb,
        "pa": pyarrow,
        "pyarrow": pyarrow,
        "jq": jq,
        "con": con,
    }
    loader = Loader()
    signal.signal(signal.SIGINT, _interrupt_cell)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{SOCKET}.{os.getpid()}"
    listener.bind(staging)
    listener.listen(64)
    with open(PID_FILE, "w") as f:
        f.write(str(os.getpid()))
    open(STARTED, "w").close()
    os.rename(staging, SOCKET)  # a relay connects only to a server that listens
    log = os.dup(1)
    hello = (json.dumps({"pid": os.getpid()}) + "\n").encode()
    while True:
        client, _ = listener.accept()
        with client:
            try:
                client.sendall(hello)
                code, outputs = _request(client)
            except (OSError, ValueError, KeyError):
                continue  # the relay went away before its cell began
            Cell.interrupted = False
            watcher = threading.Thread(target=_watch, args=(client, con), daemon=True)
            watcher.start()
            ours = set(sys._current_frames())
            left = 0
            try:
                for fd, target in zip(outputs, (1, 2), strict=True):
                    os.dup2(fd, target)
                    os.close(fd)
                exit_code = _cell(code, namespace, partial(_load, loader, con, code))
                exit_code = _figures() or exit_code
            finally:
                left = _end_threads(ours)
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                os.dup2(log, 1)
                os.dup2(log, 2)
                sweep({os.getpid()})
                _reap()
            try:
                answer = {"exit_code": exit_code, "interrupted": Cell.interrupted, "left": left}
                client.sendall((json.dumps(answer) + "\n").encode())
            except OSError:
                pass  # the relay is gone (its host process ended): the cell's result is moot
        if left:
            os._exit(EXIT_ENDED)  # a thread outlives its cell: the session goes with it


def _end_threads(ours: set[int]) -> int:
    """End the threads running Python that a cell left (SystemExit, raised in each at its
    next bytecode); how many are still there THREAD_GRACE later."""
    import ctypes

    left = set(sys._current_frames()) - ours
    for ident in left:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), ctypes.py_object(SystemExit)
        )
    deadline = time.monotonic() + THREAD_GRACE
    while left and time.monotonic() < deadline:
        time.sleep(0.005)
        left &= set(sys._current_frames())
    return len(left)


def _load(loader: Any, con: Any, code: str) -> list[str]:
    """Load the artifacts the cell names as tables, as the SQL engine does, through a cursor
    of its own: the cell's connection keeps no result of ours half-read."""
    cursor = con.cursor()
    try:
        errors: list[str] = loader.load(cursor, code)
    finally:
        cursor.close()
    return errors


def _reap() -> None:
    """Collect the cell's children the sweep killed: a zombie holds a pid (the sandbox has
    a pids limit) until its parent, the server, waits for it."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _request(client: socket.socket) -> tuple[str, list[int]]:
    data, fds, _, _ = socket.recv_fds(client, 1 << 16, 2)
    if len(fds) != 2:
        raise ValueError("a request comes with the relay's stdout and stderr")
    buffer = bytearray(data)
    while not buffer.endswith(b"\n"):
        chunk = client.recv(1 << 16)
        if not chunk:
            raise ValueError("the request was cut")
        buffer += chunk
    return str(json.loads(buffer)["code"]), fds


def _watch(client: socket.socket, con: Any) -> None:
    """Interrupt the running cell when its relay says so (its timeout): the DuckDB
    connection at once, the Python code at its next bytecode (a sleep ends early)."""
    import threading

    main = threading.main_thread().ident
    try:
        for line in client.makefile("rb"):
            if line.strip() == b"interrupt" and Cell.running:
                Cell.interrupted = True
                con.interrupt()
                if main is not None:
                    signal.pthread_kill(main, signal.SIGINT)
    except OSError:
        return


def _interrupt_cell(signum: int, frame: Any) -> None:
    if Cell.running:
        raise KeyboardInterrupt


def _cell(code: str, namespace: dict[str, Any], load: Any) -> int:
    """Run one cell; print the value of a last expression, as a notebook shows it."""
    import ast
    import traceback

    try:
        tree = ast.parse(code, "<cell>", "exec")
    except SyntaxError:
        traceback.print_exc(limit=0)
        return 1
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    body = ast.Module(tree.body[:-1] if last else tree.body, type_ignores=[])
    Cell.running = True
    try:
        for error in load():
            print(f"spillbox: {error}", file=sys.stderr)
        exec(compile(body, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
            if value is not None:
                print(repr(value))
        return 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        print(e.code, file=sys.stderr)
        return 1
    except BaseException as e:
        Cell.running = False
        print_error(e, __file__)
        return EXIT_INTERRUPTED if isinstance(e, KeyboardInterrupt) else 1
    finally:
        Cell.running = False


def _figures() -> int:
    """Save the figures the cell left open (takeout.py); 1 if that failed, said on stderr."""
    try:
        takeout.save_figures()
        return 0
    except Exception as e:
        print_error(e, __file__)
        return 1


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit(relay(sys.argv[1], float(sys.argv[2])))
