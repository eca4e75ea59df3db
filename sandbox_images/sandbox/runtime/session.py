"""The task's Python session: one long-lived interpreter per sandbox, where the names a call
defines are there in the next, as in a notebook; duckdb, pyarrow and jq are imported once.

One file, two roles (as sqlserver.py has):

    python3 -S session.py relay     the relay: what a host process execs once and keeps, as
                                    the session uid. It reads one request line at a time on
                                    stdin (a cell is never in argv, which /proc shows every
                                    process), {"mode": "run"|"reset", "code": ..., "timeout":
                                    30, "nonce": ...} or {"mode": "prepare"}, and answers in
                                    frames on stdout (wire.py): STARTED, the cell's STDOUT
                                    and STDERR, then END, {"exit_code", "oom_killed",
                                    "outputs", "nonce"}. For a cell it takes the session's
                                    lock (calls run one at a time, in the order they came,
                                    whichever host process asks), starts the server when
                                    none answers (reset: a new one in any case), hands it
                                    pipes for the cell's stdout and stderr and frames what
                                    comes, and interrupts the cell at its timeout. prepare
                                    starts the server ahead of the first cell, in a
                                    container where none has run yet.
    python3 session.py serve        the server: runs each cell in one namespace.

The session runs as its own uid (10003): a stateless script (uid 10001) can neither reach
its socket nor signal it, and the sweeps of the script uid do not end it. What a cell starts
in the background is killed when the cell ends: every process of the session uid but the
server and the relays (the processes Docker entered, whose parent is 0, which no process
inside can fake). A thread a cell leaves running is ended too (SystemExit raised in it); one
that does not end within THREAD_GRACE ends the session: a thread would write into later
cells' output and see their code. A cell writes only into its pipes, never into the relay's
stdout, and the relay is not dumpable: under runc no cell can open its descriptors or
memory in /proc. gVisor does not keep a process from another's descriptors of the same uid,
so a cell can write frames into the relay's stdout there: the END carries the nonce the host
gave this call (no cell is given it), and the host refuses an end without it. A cell can
kill the relay (the same uid): the host then reads an answer cut short, the server
interrupts the cell whose relay went away, and the host's next call opens a new relay into
the same session.

A timeout interrupts the cell as a notebook does (KeyboardInterrupt in the cell, and an
interrupt of the session's DuckDB connection): the session and its names are kept. A cell
that has not stopped INTERRUPT_GRACE seconds later is ended with its session, and the relay
says so. A server that died (a crash, the memory limit, os._exit) is replaced by a new,
empty one at the next call, which is told its names are gone.

A cell's exit code is 0, 1 for an exception, SystemExit's code, 124 when it was interrupted
at its timeout, 137 when the session ended under it.
"""

from __future__ import annotations

# The relay imports only what it needs (and runs with -S, no site-packages): its start is
# part of a task's first call. The server imports the rest.
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
import wire
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


def relay() -> int:
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    noipc.install()  # nor a cell, through the session this relay starts
    os.umask(0o077)
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        request = json.loads(line)
        _reap()  # a server this relay started that died since
        if request["mode"] == "prepare":
            _prepare()
            wire.frame(out, wire.END, json.dumps({"exit_code": 0}))
            continue
        wire.frame(out, wire.STARTED, b"")
        before = oom_count()
        try:
            status = _relay(out, str(request["mode"]), float(request["timeout"]), request)
        except Exception as e:  # the server could not start: the cell's error, not the relay's
            _note(out, f"spillbox: the Python session could not start: {e}")
            status = 1
        sys.stdout.flush()
        flags = {"oom_killed": oom_count() != before, "outputs": takeout.waiting()}
        end = {"exit_code": status, **flags, "nonce": request.get("nonce")}
        wire.frame(out, wire.END, json.dumps(end))
    return 0


def _note(out: Any, text: str) -> None:
    wire.frame(out, wire.STDERR, text + "\n")


def _prepare() -> None:
    """Start the server ahead of the first cell, if no session has run in this container
    yet (after one was lost, the next cell starts the new one, and says its names are
    gone) and no cell is starting one now."""
    if os.path.exists(STARTED):
        return
    with open(LOCK, "a") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        if not os.path.exists(STARTED):
            sock, _ = _connect_or_start()
            sock.close()


def _relay(out: Any, mode: str, timeout: float, request: dict[str, Any]) -> int:
    deadline = time.monotonic() + timeout
    with open(LOCK, "a") as lock:
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    _note(
                        out,
                        f"spillbox: the Python session was busy with another call for all of "
                        f"this call's {timeout:g} s: nothing ran; run it again",
                    )
                    return EXIT_INTERRUPTED
                time.sleep(0.005)
        if mode == "reset":
            _end_server(forget=True)
            _note(out, "spillbox: the Python session was reset: this call runs in a new, empty one")
        sock, hello = _greeted(out)
        with sock:
            return _call(out, sock, hello, str(request["code"]), deadline, timeout)


def _greeted(out: Any) -> tuple[socket.socket, dict[str, Any]]:
    """A connection to the server and its first line. A server still busy with the cell of
    a relay that went away interrupts that cell: one that does not greet within
    INTERRUPT_GRACE more is ended, and a new one started (its names are gone)."""
    sock, lost = _connect_or_start()
    try:
        hello = _hello(sock, 2 * INTERRUPT_GRACE)
    except (OSError, ValueError):
        sock.close()
        _end_server()
        sock, lost = _connect_or_start()
        hello = _hello(sock, START_SECONDS)
    if lost:
        _note(out, LOST)
    return sock, hello


def _hello(sock: socket.socket, seconds: float) -> dict[str, Any]:
    """The server's first line (it sends nothing more before the cell's answer)."""
    sock.settimeout(seconds)
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = sock.recv(1 << 12)
        if not chunk:
            raise ValueError("the server closed the connection")
        data += chunk
    sock.settimeout(None)
    hello: dict[str, Any] = json.loads(data)
    return hello


def _call(
    out: Any, sock: socket.socket, hello: dict[str, Any], code: str, deadline: float, timeout: float
) -> int:
    pipes = [os.pipe(), os.pipe()]
    request = (json.dumps({"code": code}) + "\n").encode()
    try:
        socket.send_fds(sock, [request[:1]], [pipes[0][1], pipes[1][1]])
        sock.sendall(request[1:])
    finally:
        for _, write_end in pipes:
            os.close(write_end)
    cell = Relayed(out, sock, {pipes[0][0]: wire.STDOUT, pipes[1][0]: wire.STDERR})
    answer = cell.pump(deadline, int(hello["pid"]))
    if cell.ended:
        _note(
            out,
            f"spillbox: the cell did not stop within {INTERRUPT_GRACE:g} s of its interrupt at "
            f"the {timeout:g} s timeout: the session was ended and its names are gone; the next "
            "call starts a new one",
        )
        return EXIT_INTERRUPTED
    return _ended(out, answer, timeout)


class Relayed:
    """One cell as the relay sees it: its pipes, framed onto the relay's stdout as they come,
    and the server's answer line; the interrupt at the deadline, and the end of the session
    if the cell does not stop INTERRUPT_GRACE later."""

    def __init__(self, out: Any, sock: socket.socket, pipes: dict[int, bytes]) -> None:
        import selectors

        self.out, self.sock = out, sock
        self.selector = selectors.DefaultSelector()
        for fd, kind in pipes.items():
            self.selector.register(fd, selectors.EVENT_READ, kind)
        self.selector.register(sock, selectors.EVENT_READ, None)
        self.open = len(pipes) + 1
        self.answer = bytearray()
        self.interrupted = False
        self.ended = False

    def pump(self, deadline: float, server: int) -> bytes:
        """The server's answer (without a newline if it died first), once the pipes ended."""
        while self.open:
            ready = self.selector.select(max(deadline - time.monotonic(), 0))
            if not ready and time.monotonic() >= deadline:
                if self.ended:
                    break  # what holds the pipes open is not the session's: stop reading
                deadline = time.monotonic() + INTERRUPT_GRACE
                if self.interrupted:
                    self.ended = True
                    _end_server(server)
                    continue
                self.interrupted = True
                try:
                    self.sock.sendall(b"interrupt\n")
                except OSError:
                    pass  # the server is gone: its end is read below
            for key, _ in ready:
                self._read(key)
        for key in list(self.selector.get_map().values()):
            if key.data is not None:
                os.close(key.fd)
        self.selector.close()
        return bytes(self.answer)

    def _read(self, key: Any) -> None:
        if key.data is None:
            try:
                chunk = self.sock.recv(1 << 12)
            except OSError:
                chunk = b""
            self.answer += chunk
            if chunk and not self.answer.endswith(b"\n"):
                return
            if not chunk:
                sweep({os.getpid()})  # a dead server's children may hold the pipes
        else:
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                return
            if chunk:
                wire.frame(self.out, key.data, chunk)
                return
            os.close(key.fd)
        self.selector.unregister(key.fileobj)
        self.open -= 1


def _ended(out: Any, answer: bytes, timeout: float) -> int:
    """The cell's exit code from the server's answer, and what the host should be told."""
    if not answer.endswith(b"\n"):
        _note(
            out,
            "spillbox: the Python session ended while this cell ran (it crashed, exited, or "
            "ran out of memory): its names are gone; the next call starts a new, empty one",
        )
        return EXIT_ENDED
    ended = json.loads(answer)
    if ended.get("left"):
        _note(
            out,
            f"spillbox: the cell left {ended['left']} thread(s) running that did not stop "
            f"within {THREAD_GRACE:g} s (a thread would write into later cells' output): the "
            "session was ended and its names are gone; join threads before a cell ends",
        )
    if ended["interrupted"]:
        _note(
            out,
            f"spillbox: the cell was interrupted at its {timeout:g} s timeout; the session "
            "is kept, with the names defined before the interrupt",
        )
        return EXIT_INTERRUPTED
    return int(ended["exit_code"])


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
    """Which cell this is, whether it runs (an interrupt that comes after it ended is
    ignored), and whether it was interrupted."""

    number = 0
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
            Cell.number += 1
            watcher = threading.Thread(target=_watch, args=(client, con, Cell.number), daemon=True)
            watcher.start()
            ours = set(sys._current_frames())
            left = 0
            try:
                for fd, target in zip(outputs, (1, 2), strict=True):
                    os.dup2(fd, target)
                    os.close(fd)
                try:
                    exit_code = _cell(code, namespace, partial(_load, loader, con, code))
                    exit_code = _figures() or exit_code
                except OSError:  # writing the cell's error: its relay, the reader, is gone
                    exit_code = 1
            finally:
                left = _end_threads(ours)
                _flush_or_drop()
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


def _flush_or_drop() -> None:
    """Flush what the cell printed; what cannot be written (its relay, the reader, is gone)
    goes nowhere, not into the next cell's output."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, stream.fileno())
                os.close(devnull)
                stream.flush()
            except (OSError, ValueError):
                pass  # the cell closed or replaced the stream: nothing of it is left to leak


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


def _watch(client: socket.socket, con: Any, number: int) -> None:
    """Interrupt the running cell when its relay says so (its timeout), or when its relay
    went away (killed: no one is left to read the cell's output, and the next relay waits
    for this server): the DuckDB connection at once, the Python code at its next bytecode
    (a sleep ends early)."""
    try:
        for line in client.makefile("rb"):
            if line.strip() == b"interrupt":
                _interrupt(con, number)
    except OSError:
        pass
    _interrupt(con, number)


def _interrupt(con: Any, number: int) -> None:
    import threading

    main = threading.main_thread().ident
    if Cell.running and Cell.number == number:
        Cell.interrupted = True
        con.interrupt()
        if main is not None:
            signal.pthread_kill(main, signal.SIGINT)


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
        sys.exit(relay())
