"""MCP clients over streamable HTTP (`spillbox mcp proxy --listen 127.0.0.1:PORT`): each
MCP session is one client connection, as a stdio process is, with its own task, upstream
and gate.

    listen = parse_listen("127.0.0.1:8931")
    await serve_http(listen, open_task, connect)   # until cancelled (or SIGINT/SIGTERM)

The SDK's session manager serves one Server for all sessions, but a proxy is one per
session (its upstream, its task, its tool names), so sessions are routed here, each to the
SDK's own transport for one session (StreamableHTTPServerTransport: the session id, POST,
GET and DELETE), but that a request whose answer comes alone is answered with JSON, not
SSE (spillbox.mcp.deferred). Before any of that, every request's Host and Origin are
checked (DNS rebinding: a page in a browser must not reach sandbox_exec): another origin
gets 403, another host 421. A request whose MCP-Protocol-Version this server does not
speak gets 400, an unknown or ended session 404. Requests are routed on their headers
(Mcp-Method, Spillbox-Task) where those tell, the body left to the SDK's transport.

At most max_sessions sessions are open at once (each has an upstream process and a task):
an initialize past that gets 503, and opens no task and starts no upstream.

A session ends when its client deletes it, when it has had no request in flight for
session_timeout seconds, or when the server stops; its upstream is then stopped and its
task closed, which applies the task's retention (keep_after_close).
"""

from __future__ import annotations

import ipaddress
import json
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import anyio
import anyio.abc
import anyio.to_thread
import mcp_types as types
import uvicorn
from mcp.server._streamable_http_modern import handle_modern_request
from mcp.server.runner import serve_loop
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    RequestBodyLimitMiddleware,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from mcp.shared.inbound import MCP_METHOD_HEADER, MCP_PROTOCOL_VERSION_HEADER
from mcp_types import CLIENT_INFO_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from spillbox.errors import ConfigError
from spillbox.mcp.deferred import DeferredSSETransport
from spillbox.mcp.proxy import Proxy
from spillbox.mcp.upstream import one_line
from spillbox.protocols import TaskHandle

ENDPOINT = "/mcp"
DEFAULT_SESSION_TIMEOUT_SECONDS = 300.0
"""A session with no request in flight (and no open GET stream) this long is ended, and a
2026-07-28 client's task with no request this long is closed: a client that never ends its
session (the MCP Inspector) leaves an upstream process running only this long."""
TASK_HEADER = "spillbox-task"
"""The header (or `_meta` key, TASK_META_KEY) that names a 2026-07-28 client's task."""
TASK_META_KEY = "spillbox/task"
IDLE_CHECK_SECONDS = 5.0
"""How often stateless tasks are checked for their idle timeout."""
DEFAULT_MAX_SESSIONS = 8
"""How many sessions may be open at once: each runs an upstream server of its own and has
a task, so a client opening sessions without end would exhaust the machine's memory."""
SHUTDOWN_GRACE_SECONDS = 5
"""On SIGINT or SIGTERM, how long requests in flight (and open SSE streams) are given."""
BACKLOG = 128
SUPPORTED = (*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS)
_SIGNALS = (signal.SIGINT, signal.SIGTERM)

OpenTask = Callable[[str | None], AbstractContextManager[TaskHandle]]
"""Opens the named task (None: a new task of its own), blocking: run it in a worker
thread; closing it applies the task's retention."""
Connect = Callable[[TaskHandle], AbstractAsyncContextManager[Proxy]]
"""A proxy for one session's task, its upstream started, stopped when the session ends."""


@dataclass(frozen=True)
class Listen:
    """Where to serve: a loopback host and a port (0: any free port)."""

    host: str
    port: int
    allowed_origins: Sequence[str] = ()
    """Origins besides this server's own that may send requests (a browser-based client)."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    """How many MCP sessions may be open at once; an initialize past that gets 503."""

    def security(self, port: int) -> TransportSecuritySettings:
        """Host and Origin checks for the port actually bound."""
        names = ["127.0.0.1", "localhost", "[::1]"]
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=[f"{name}:{port}" for name in names],
            allowed_origins=[*(f"http://{name}:{port}" for name in names), *self.allowed_origins],
        )


def parse_listen(
    value: str, allowed_origins: Sequence[str] = (), max_sessions: int = DEFAULT_MAX_SESSIONS
) -> Listen:
    """HOST:PORT, where HOST is a loopback address: spillbox serves no authentication, so
    serving sandbox_exec to the network would hand it to anyone who can connect."""
    host, _, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen {value}: give HOST:PORT, for example 127.0.0.1:8931")
    if not _loopback(host):
        raise ConfigError(
            f"--listen {value}: spillbox serves MCP on a loopback address only (127.0.0.1, "
            "::1 or localhost), since it has no authentication; put an authenticating "
            "proxy in front of it to serve others"
        )
    for origin in allowed_origins:
        if not origin.startswith(("http://", "https://")) or origin.count("/") != 2:
            raise ConfigError(
                f"--allow-origin {origin}: give an origin, scheme and host (and port) only, "
                "for example http://localhost:6274"
            )
    if max_sessions < 1:
        raise ConfigError(f"--max-sessions {max_sessions}: give 1 or more")
    return Listen(host, int(port), tuple(allowed_origins), max_sessions)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Sessions:
    """The ASGI app: one proxy per MCP session, routed by the session id header."""

    def __init__(
        self,
        open_task: OpenTask,
        connect: Connect,
        security: TransportSecuritySettings,
        group: anyio.abc.TaskGroup,
        session_timeout: float | None = DEFAULT_SESSION_TIMEOUT_SECONDS,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        task: str | None = None,
    ) -> None:
        self.open_task = open_task
        self.task = task
        """The task every session and request is served (--task); None: each its own."""
        self.connect = connect
        self.security = security
        self.checks = TransportSecurityMiddleware(security)
        self.group = group
        self.session_timeout = session_timeout
        self.max_sessions = max_sessions
        self.live: dict[str, StreamableHTTPServerTransport] = {}
        self.opening = 0
        """Sessions whose task is being opened (not yet in live): they count against the cap."""
        self.stateless: dict[str, _Stateless] = {}
        """2026-07-28 clients' tasks by name, each with its proxy."""
        self._creating = anyio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        refused = await self.checks.validate_request(request)  # Host and Origin
        if refused is None and scope["path"] != ENDPOINT:
            refused = Response(f"Not Found: MCP is served at {ENDPOINT}", status_code=404)
        version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if refused is None and version is not None and version not in SUPPORTED:
            refused = _error(
                f"Bad Request: unsupported {MCP_PROTOCOL_VERSION_HEADER} {version!r}; this "
                f"server speaks {', '.join(SUPPORTED)}",
                400,
            )
        session_id = request.headers.get(MCP_SESSION_ID_HEADER)
        if refused is not None:
            await refused(scope, receive, send)
        elif version in MODERN_PROTOCOL_VERSIONS:
            await self._stateless(request, scope, receive, send)
        elif session_id is None:
            await self._open(scope, receive, send)
        elif (transport := self.live.get(session_id)) is None:
            await _error("Not Found: no such session (it ended); initialize a new one", 404)(
                scope, receive, send
            )
        else:
            await transport.handle_request(scope, receive, send)
            if transport.is_terminated:
                self.live.pop(session_id, None)

    async def _stateless(
        self, request: Request, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A 2026-07-28 request (no session: each POST stands alone), served by the SDK's
        single-exchange entry with the proxy of the task it names (TASK_HEADER or the
        `_meta` key TASK_META_KEY; else the client's clientInfo name), opened on first use.

        Routed on headers where they tell: a POST without Mcp-Method (which the SDK
        refuses) opens no task, and the body is read here only for a task name that
        neither --task nor TASK_HEADER gives (the SDK reads it as it comes otherwise)."""
        if request.method == "POST" and MCP_METHOD_HEADER not in request.headers:
            refused = _error(
                f"Bad Request: a {request.headers[MCP_PROTOCOL_VERSION_HEADER]} request "
                f"names its method in the {MCP_METHOD_HEADER} header",
                400,
            )
            await refused(scope, receive, send)
            return
        name = self.task or request.headers.get(TASK_HEADER)
        if name is None:
            body = await request.body()
            name, receive = _named_task(body), _replay(body, receive)
        entry = self.stateless.get(name)
        if entry is None:
            async with self._creating:
                entry = self.stateless.get(name)
                if entry is None:
                    if self._full():
                        await self._refuse_full(scope, receive, send)
                        return
                    try:
                        entry = await self.group.start(self._serve_stateless, name)
                    except Exception as e:  # noqa: BLE001 - the client is told; the server goes on
                        await _not_opened(e, scope, receive, send)
                        return
        entry.busy += 1
        try:
            await handle_modern_request(
                entry.proxy.server,
                self.security,
                False,
                entry.state,
                scope,
                receive,
                send,
            )
        finally:
            entry.busy -= 1
            entry.last = anyio.current_time()

    async def _serve_stateless(
        self, name: str, *, task_status: anyio.abc.TaskStatus[_Stateless]
    ) -> None:
        """Serve one named task's proxy until no request has come for session_timeout
        seconds (or the server stops), then stop its upstream and close the task."""
        task = await anyio.to_thread.run_sync(self.open_task, name)
        try:
            async with self.connect(task.__enter__()) as proxy:
                server = proxy.server
                async with server.lifespan(server) as state:
                    entry = _Stateless(proxy, state, anyio.current_time())
                    self.stateless[name] = entry
                    task_status.started(entry)
                    # Polled: the deadline moves with every request.
                    # A call waiting for the client's answers (a round) keeps it open.
                    while (  # noqa: ASYNC110
                        self.session_timeout is None
                        or entry.busy
                        or proxy.rounds.open
                        or anyio.current_time() - entry.last < self.session_timeout
                    ):
                        await anyio.sleep(IDLE_CHECK_SECONDS)
        finally:
            self.stateless.pop(name, None)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(task.__exit__, None, None, None)

    def _full(self) -> bool:
        return len(self.live) + len(self.stateless) + self.opening >= self.max_sessions

    async def _refuse_full(self, scope: Scope, receive: Receive, send: Send) -> None:
        idle = (
            f" or wait until one has been idle for {self.session_timeout:g} s (--session-timeout)"
            if self.session_timeout
            else ""
        )
        full = _error(
            f"Service Unavailable: {self.max_sessions} MCP sessions are open (a 2026-07-28 "
            "client's task counts as one), the most this server takes (--max-sessions); end "
            f"one (HTTP DELETE, as the SDK clients do on close){idle}",
            503,
            types.INTERNAL_ERROR,
        )
        await full(scope, receive, send)

    async def _open(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request without a session id: an initialize opens a session, with its task;
        anything else is refused before a task is opened for it (by its Mcp-Method
        header where the client sends one, unread; else by its body's method)."""
        method = Request(scope).headers.get(MCP_METHOD_HEADER)
        if method is None:
            body = await Request(scope, receive).body()
            method = "initialize" if _is_initialize(body) else None
            receive = _replay(body, receive)
        if method != "initialize":
            refused = _error("Bad Request: no Mcp-Session-Id; send initialize first", 400)
            await refused(scope, receive, send)
            return
        if self._full():
            await self._refuse_full(scope, receive, send)
            return
        self.opening += 1  # no await between the check and this: sessions cannot overtake
        try:
            task = await anyio.to_thread.run_sync(self.open_task, self.task)
        except Exception as e:  # noqa: BLE001 - the client is told; the server goes on
            await _not_opened(e, scope, receive, send)
            return
        finally:
            self.opening -= 1
        transport = DeferredSSETransport(
            mcp_session_id=uuid4().hex,
            security_settings=self.security,
            idle_timeout=self.session_timeout,
        )
        assert transport.mcp_session_id is not None
        self.live[transport.mcp_session_id] = transport
        established = False
        try:
            await self.group.start(self._serve, transport, task)
            status = await _status(transport.handle_request, scope, receive, send)
            established = status is not None and status < 400
        finally:
            if not established:
                with anyio.CancelScope(shield=True):
                    await transport.terminate()

    async def _serve(
        self,
        transport: StreamableHTTPServerTransport,
        task: AbstractContextManager[TaskHandle],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve one session until it ends, then stop its upstream and close its task."""
        session_id = transport.mcp_session_id
        try:
            async with transport.connect() as (read, write):
                task_status.started()
                idle = transport.idle_scope or anyio.CancelScope()
                with idle:
                    async with self.connect(task.__enter__()) as proxy:
                        server = proxy.server
                        async with server.lifespan(server) as state:
                            await serve_loop(
                                server,
                                read,
                                write,
                                lifespan_state=state,
                                session_id=session_id,
                                init_options=proxy.options(),
                            )
        finally:
            assert session_id is not None
            self.live.pop(session_id, None)
            with anyio.CancelScope(shield=True):
                await transport.terminate()
                await anyio.to_thread.run_sync(task.__exit__, None, None, None)


def listening_socket(listen: Listen) -> socket.socket:
    """A TCP socket bound to listen's address and listening (connections wait from now,
    not refused while uvicorn starts).

    Made with its protocol named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only
    on connections whose socket says IPPROTO_TCP, and one accepted from a socket made with
    protocol 0 says 0. With Nagle on, a response written in two pieces (its headers, then
    its body) waited for the client's delayed ACK: 40 ms more per 2026-07-28 request, 52 ms
    an echo call where 4.6 with it off."""
    family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((listen.host, listen.port))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise ConfigError(f"--listen {listen.host}:{listen.port}: {e.strerror}") from None
    return sock


async def serve_http(
    listen: Listen,
    open_task: OpenTask,
    connect: Connect,
    session_timeout: float | None = DEFAULT_SESSION_TIMEOUT_SECONDS,
    task: str | None = None,
) -> None:
    """Serve MCP sessions at http://HOST:PORT/mcp until cancelled or sent SIGINT/SIGTERM;
    then end every session (upstreams stopped, tasks closed). task: the one task every
    session and 2026-07-28 request is served (None: each session its own, each 2026-07-28
    client the one it names)."""
    sock = listening_socket(listen)
    port = sock.getsockname()[1]
    async with anyio.create_task_group() as group:
        sessions = Sessions(
            open_task,
            connect,
            listen.security(port),
            group,
            session_timeout,
            listen.max_sessions,
            task,
        )
        config = uvicorn.Config(
            RequestBodyLimitMiddleware(sessions, DEFAULT_MAX_REQUEST_BODY_SIZE),
            lifespan="off",
            log_level="warning",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
        )
        server = _Server(config)
        host = f"[{listen.host}]" if ":" in listen.host else listen.host
        print(f"spillbox: serving MCP at http://{host}:{port}{ENDPOINT}", file=sys.stderr)
        await server.serve(sockets=[sock])
        group.cancel_scope.cancel()


class _Server(uvicorn.Server):
    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Stop serving on SIGINT or SIGTERM, and then return, so that the sessions end
        (upstreams stopped, tasks closed): uvicorn's own raises the signal again, which
        would end the process first."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@dataclass
class _Stateless:
    """The proxy of a task that 2026-07-28 clients name, and when it was last used."""

    proxy: Proxy
    state: Any
    last: float
    busy: int = 0


def _named_task(body: bytes) -> str:
    """The task a 2026-07-28 request names in _meta, else one for its client's name."""
    try:
        message = json.loads(body)
        meta = message["params"]["_meta"]
    except (ValueError, KeyError, TypeError):
        return "mcp-client"
    if not isinstance(meta, dict):
        return "mcp-client"
    named = meta.get(TASK_META_KEY)
    if isinstance(named, str) and named:
        return named
    info = meta.get(CLIENT_INFO_META_KEY)
    client = info.get("name") if isinstance(info, dict) else None
    slug = re.sub(r"[^a-z0-9]+", "-", client.lower()).strip("-") if isinstance(client, str) else ""
    return f"mcp-{slug[:40] or 'client'}"


async def _not_opened(error: Exception, scope: Scope, receive: Receive, send: Send) -> None:
    """A task that could not be opened: said on stderr and to the client (500)."""
    message = f"spillbox could not open the session's task: {one_line(error)}"
    print(f"spillbox: {message}", file=sys.stderr)
    await _error(message, 500, types.INTERNAL_ERROR)(scope, receive, send)


def _is_initialize(body: bytes) -> bool:
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("method") == "initialize"


def _replay(body: bytes, receive: Receive) -> Receive:
    """The request's body again, for the transport, once this module has read it; then
    the connection's own messages (its disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def _error(message: str, status: int, code: int = types.INVALID_REQUEST) -> Response:
    """A JSON-RPC error (id null) with an HTTP status, as the SDK's transport answers."""
    body = types.JSONRPCError(
        jsonrpc="2.0", id=None, error=types.ErrorData(code=code, message=message)
    )
    return Response(
        body.model_dump_json(by_alias=True, exclude_unset=True),
        status_code=status,
        media_type="application/json",
    )


async def _status(app: Any, scope: Scope, receive: Receive, send: Send) -> int | None:
    """Run app for one request; the HTTP status it answered with (None: no answer)."""
    status: int | None = None

    async def watch(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await app(scope, receive, watch)
    return status
