"""The command line: each command parses, makes one library call, and prints."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spillbox.errors import ConfigError, SpillboxError
from spillbox.langs import LANGS

if TYPE_CHECKING:
    from typing import TypeAlias

    from spillbox.config import SandboxKind
    from spillbox.harness import Harness, Task
    from spillbox.sandbox.image import BuildEvent
    from spillbox.types import Admitted, ArtifactRow

    _Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

# The settings (tiktoken), the harness (the catalog, Docker), the tools, retention and the
# records of spillbox.types (dataclasses, which imports inspect) are imported by the
# commands that use them: `spillbox --version` and `--help` pay for none.


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
        return result
    except SpillboxError as e:
        print(f"spillbox: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spillbox: interrupted", file=sys.stderr)
        return 130


ABOUT = """\
spillbox keeps large tool results out of an agent's context: a result over the token
limit is stored in the task's Docker sandbox, and the model gets a short notice instead,
from which it queries the result (SQL, jq, Python, sh) or reads it page by page."""

FIRST_STEPS = """\
a first try, with a large JSON file (the sandbox needs Docker):
  spillbox offload --task demo prs.json
  spillbox exec --task demo --lang sql 'SELECT count(*) AS n FROM "prs"'"""


class _Version(argparse.Action):
    """--version, printed as soon as it is parsed (the commands' options are never read)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from spillbox._version import __version__

        print(f"spillbox {__version__}")  # on stdout, as argparse's own version action does
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spillbox",
        description=ABOUT,
        epilog=FIRST_STEPS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    common = _common_flags()
    # In the order `spillbox --help` lists them.
    _script_commands(commands, common)
    _task_commands(commands, common)
    _host_command(commands)
    _upkeep_commands(commands, common)
    _tool_commands(commands, common)
    _demo_command(commands)
    mcp = commands.add_parser("mcp", help="spillbox as an MCP server (stdio or HTTP)")
    mcp_commands = mcp.add_subparsers(required=True, metavar="ACTION")
    _mcp_proxy_command(mcp_commands, common)
    _mcp_serve_command(mcp_commands, common)
    _image_commands(commands)
    return parser


def _common_flags() -> argparse.ArgumentParser:
    """The flags of every command that opens the harness (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--home", help="spillbox home (default: SPILLBOX_HOME or the user data dir)"
    )
    common.add_argument(
        "--sandbox", choices=["none", "docker"], help="sandbox kind (default: docker)"
    )
    common.add_argument(
        "--cluster",
        help="a Ray cluster's address whose spillbox hosts keep the tasks "
        "(default: SPILLBOX_CLUSTER; needs SPILLBOX_CATALOG_URL)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")
    return common


def _script_commands(commands: _Commands, common: argparse.ArgumentParser) -> None:
    """offload and exec: a task's payloads in, and the scripts that query them."""
    offload = commands.add_parser(
        "offload", parents=[common], help="admit files as one step's tool results"
    )
    offload.add_argument("--task", required=True)
    _retention_flags(offload)
    offload.add_argument("--tool", help="tool name (default: each file's stem)")
    offload.add_argument("files", nargs="+", metavar="FILE")
    offload.set_defaults(func=_offload)

    exec_ = commands.add_parser("exec", parents=[common], help="run a code-mode script")
    exec_.add_argument("--task", required=True)
    _retention_flags(exec_)
    exec_.add_argument("--lang", required=True, choices=LANGS)
    exec_.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    exec_.add_argument("--artifact", help="the artifact a jq filter runs over (id or file name)")
    exec_.add_argument(
        "--session",
        action="store_true",
        help="python: run in the task's persistent session (names from earlier calls remain)",
    )
    exec_.add_argument(
        "--reset-session",
        action="store_true",
        help="python: start the task's session afresh, then run CODE in it",
    )
    exec_.add_argument("code", metavar="CODE", help="the script, or - to read it from stdin")
    exec_.set_defaults(func=_exec)


def _task_commands(commands: _Commands, common: argparse.ArgumentParser) -> None:
    """The tasks and their artifacts: list, delete, copy out, hold."""
    tasks = commands.add_parser("tasks", parents=[common], help="list tasks")
    tasks.set_defaults(func=_tasks)

    rm = commands.add_parser("rm", parents=[common], help="delete a task: sandbox and storage")
    rm.add_argument("task", metavar="TASK")
    rm.set_defaults(func=_rm)

    artifacts = commands.add_parser("artifacts", parents=[common], help="list a task's artifacts")
    artifacts.add_argument("task", metavar="TASK")
    artifacts.add_argument("--all", action="store_true", help="include deleted ones (tombstones)")
    artifacts.set_defaults(func=_artifacts)

    export = commands.add_parser(
        "export", parents=[common], help="copy an artifact out (if the policy allows; logged)"
    )
    export.add_argument("task", metavar="TASK")
    export.add_argument("artifact", metavar="ARTIFACT", help="artifact id or call id")
    export.add_argument("dest", metavar="DEST")
    export.set_defaults(func=_export)

    for name, pinned in (("pin", True), ("unpin", False)):
        command = commands.add_parser(
            name, parents=[common], help=f"{name} an artifact (legal hold)"
        )
        command.add_argument("task", metavar="TASK")
        command.add_argument("artifact", metavar="ARTIFACT", help="artifact id or call id")
        command.set_defaults(func=_pin, pinned=pinned)


def _host_command(commands: _Commands) -> None:
    host = commands.add_parser(
        "host", help="start this Ray node's spillbox host (run on the node, after ray start)"
    )
    host.add_argument("--name", help="the host's name (default: this machine's hostname)")
    host.add_argument("--home", required=True, help="the node's spillbox home")
    host.add_argument("--cap", type=int, help="open tasks it takes at most (default: 500)")
    host.add_argument("--runtime", help='the OCI runtime of its sandboxes, e.g. "runsc"')
    host.add_argument("--address", default="auto", help="the cluster (default: auto)")
    host.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve the host's metrics at http://HOST:PORT/metrics (default: "
        "SPILLBOX_METRICS_LISTEN; none if unset)",
    )
    host.set_defaults(func=_host)


def _upkeep_commands(commands: _Commands, common: argparse.ArgumentParser) -> None:
    """Collection and the access log."""
    gc = commands.add_parser("gc", parents=[common], help="collect expired and orphaned things")
    gc.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    gc.set_defaults(func=_gc)

    audit = commands.add_parser("audit", parents=[common], help="a task's access log")
    audit.add_argument("task", metavar="TASK")
    audit.set_defaults(func=_audit)


def _tool_commands(commands: _Commands, common: argparse.ArgumentParser) -> None:
    """The model-facing tools: their definitions, and a call as the model makes it."""
    tools = commands.add_parser("tools", help="print the model-facing tool definitions")
    tools.add_argument("--format", choices=["openai", "responses", "anthropic"], default="openai")
    tools.add_argument(
        "--sandbox", choices=["none", "docker"], help="sandbox kind (default: docker)"
    )
    tools.set_defaults(func=_tools)

    call = commands.add_parser(
        "call", parents=[common], help="call a spillbox tool as the model would"
    )
    call.add_argument("--task", required=True)
    call.add_argument("tool", metavar="TOOL")
    call.add_argument("arguments", metavar="JSON-ARGS", nargs="?", default="{}")
    call.set_defaults(func=_call)


def _demo_command(commands: _Commands) -> None:
    demo = commands.add_parser(
        "demo", help="run the examples end to end in real sandboxes with a scripted model"
    )
    demo.add_argument("--home", help="spillbox home (default: a temp folder, removed after)")
    demo.set_defaults(func=_demo)


def _mcp_proxy_command(mcp_commands: _Commands, common: argparse.ArgumentParser) -> None:
    proxy = mcp_commands.add_parser(
        "proxy",
        parents=[common],
        help="gate every tool result of an MCP server: spillbox mcp proxy -- COMMAND ARGS...",
    )
    proxy.add_argument("--task", help="task id (default: a new task per connection)")
    _seconds(
        proxy,
        "--upstream-timeout",
        "cancel a request the server leaves without an answer or progress this long "
        "(default 300; 0: never)",
    )
    _seconds(
        proxy,
        "--step-bound",
        "how long a finished result waits for the other calls of its step (default 2)",
    )
    _retention_flags(proxy)
    _listen_flags(proxy)
    proxy.add_argument("--url", help="a server that speaks streamable HTTP, in place of COMMAND")
    _seconds(
        proxy,
        "--upstream-start-timeout",
        "how long the server may take to answer its handshake (default 8; more for a "
        "server that npx downloads on first use)",
    )
    # Everything from the first word that is not an option on is the server's command
    # line, with or without a -- before it (the MCP Inspector drops a -- it is given).
    proxy.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="COMMAND", help="the server to run (or --url)"
    )
    proxy.set_defaults(func=_mcp)


_UPSTREAM_ARGUMENTS = ("command", "url", "upstream_timeout", "upstream_start_timeout", "step_bound")
"""What `mcp proxy` parses of the server it gates."""


def _mcp_serve_command(mcp_commands: _Commands, common: argparse.ArgumentParser) -> None:
    serve = mcp_commands.add_parser(
        "serve", parents=[common], help="spillbox's tools alone, over a task's payloads"
    )
    serve.add_argument("--task", required=True)
    _retention_flags(serve)
    _listen_flags(serve)
    # What `mcp proxy` reads of its upstream, empty: _mcp serves the task's tools alone.
    serve.set_defaults(func=_mcp, **dict.fromkeys(_UPSTREAM_ARGUMENTS))


def _image_commands(commands: _Commands) -> None:
    image = commands.add_parser("image", help="the sandbox image")
    image_commands = image.add_subparsers(required=True, metavar="ACTION")
    build = image_commands.add_parser(
        "build",
        help="build the sandbox image if missing",
        description="Build the sandbox image if missing, showing its steps on stderr; the last "
        "line (stdout) is the image's tag and size.",
    )
    build.add_argument("--base", choices=["auto", "registry", "debootstrap"], default="auto")
    build.add_argument("--force", action="store_true", help="rebuild even if present")
    build.add_argument(
        "--quiet", action="store_true", help="print only the last line (for scripts)"
    )
    build.set_defaults(func=_image_build)


def _seconds(parser: argparse._ActionsContainer, flag: str, help: str) -> None:
    """A flag that takes a duration in seconds."""
    parser.add_argument(flag, type=float, metavar="SECONDS", help=help)


def _listen_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("clients over streamable HTTP (default: one client on stdio)")
    group.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="serve MCP at http://HOST:PORT/mcp, a loopback address (port 0: any free one); "
        "each MCP session gets its own task (or --task's) and its own upstream",
    )
    group.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an Origin besides the server's own that may send requests (a browser-based "
        "client, e.g. http://localhost:6274); others get 403",
    )
    _seconds(
        group,
        "--session-timeout",
        "end a session with no request in flight this long (default 300)",
    )
    group.add_argument(
        "--max-sessions",
        type=int,
        metavar="N",
        help="how many sessions may be open at once, each with its own upstream (default 8); "
        "an initialize past that gets 503",
    )
    group.add_argument(
        "--pool-size",
        type=int,
        metavar="N",
        help="ready Docker sandboxes kept for new sessions' tasks (default SPILLBOX_POOL_SIZE, "
        "else 2; 0: none)",
    )


def _retention_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("retention (applies to the task from now on)")
    group.add_argument("--ttl", metavar="DURATION", help="artifact lifetime: 90s, 15m, 24h, 7d")
    group.add_argument("--ttl-from", choices=["created", "access"])
    group.add_argument(
        "--keep-after-close", metavar="DURATION", help="0 deletes the task when it closes"
    )
    group.add_argument("--max-bytes", metavar="SIZE", help="quota: 500K, 20M, 1G")
    group.add_argument("--max-artifacts", metavar="N")
    group.add_argument("--on-quota", choices=["evict", "refuse"])
    group.add_argument("--export", choices=["allow", "deny"])
    group.add_argument("--redact", action="store_const", const="true", help="redact secrets")


_RETENTION_FLAGS = (
    "ttl", "ttl_from", "keep_after_close", "max_bytes", "max_artifacts", "on_quota", "export",
    "redact",
)  # fmt: skip


def _harness(args: argparse.Namespace) -> Harness:
    from spillbox.harness import Harness

    sandbox: SandboxKind | None = args.sandbox
    # A CLI process is short-lived: collection runs as `spillbox gc`, not in the background,
    # and a warm pool would only start containers that its one task never uses.
    return Harness(
        sandbox=sandbox,
        home=args.home,
        gc_interval=-1,
        pool_size=0,
        cluster=getattr(args, "cluster", None),
    )


def _host(args: argparse.Namespace) -> int:
    """Start the host on this node: its catalog is SPILLBOX_CATALOG_URL (every host's)."""
    import socket

    from spillbox.config import Settings

    settings = Settings.from_env()
    if settings.catalog_url is None:
        raise ConfigError("a spillbox host needs SPILLBOX_CATALOG_URL: the cluster's Postgres")
    try:
        from spillbox.sandbox.ray.backend import connect
        from spillbox.sandbox.ray.host import DEFAULT_CAP, HostSettings
        from spillbox.sandbox.ray.start import start_host
    except ImportError as e:
        raise ConfigError(f"a spillbox host needs Ray: pip install 'spillbox[ray]' ({e})") from None
    connect(args.address)
    host = HostSettings(
        args.name or socket.gethostname(),
        str(Path(args.home).expanduser().resolve()),
        settings.catalog_url,
        cap=args.cap or DEFAULT_CAP,
        runtime=args.runtime,
        metrics_listen=args.metrics_listen or settings.metrics_listen,
    )
    info = start_host(host)
    served = f", metrics on port {info['metrics_port']}" if info["metrics_port"] else ""
    print(
        f"spillbox host {info['name']} is up (epoch {info['epoch']}, home {info['home']}{served})"
    )
    return 0


def _task(args: argparse.Namespace, harness: Harness, task_id: str | None = None) -> Task:
    """The task named on the command line (or task_id), with the retention flags given."""
    from spillbox.retention import Retention, policy_for

    task_id = task_id or args.task
    flags = {name: getattr(args, name, None) for name in _RETENTION_FLAGS}
    retention = None
    if any(value is not None for value in flags.values()):
        known = harness.catalog.task(task_id)
        base = policy_for(known, None, harness.settings.retention)
        retention = Retention.from_options(flags, base)
    return harness.task(task_id, retention=retention)


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, ensure_ascii=False) if args.json else text)


def _field(value: str | None) -> str:
    """A value in a line of text output, as it is if printable; else in Python's escaped
    form (repr), so that a newline, a tab or U+2028 in an id a model or a tool chose never
    makes a line or a column of its own (--json gives the exact value)."""
    if value is None:
        return "-"
    return value if value.isprintable() else repr(value)


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _offload(args: argparse.Namespace) -> int:
    from spillbox.types import ToolResult

    results = []
    for name in args.files:
        path = Path(name)
        try:
            content = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read {name}: {e.strerror}") from None
        # The file keeps its name (big.json); its call id and table are the stem (big).
        stem = path.stem or path.name
        results.append(ToolResult(stem, args.tool or stem, content, file_name=path.name))
    with _harness(args) as harness, _task(args, harness) as task:
        admitted = task.admit(results)
    for item in admitted:
        print(json.dumps(_admitted_json(item), ensure_ascii=False) if args.json else item.text)
    return 0


def _admitted_json(item: Admitted) -> dict[str, Any]:
    artifact = item.artifact
    return {
        "call_id": item.call_id,
        "tool": item.tool,
        "offloaded": item.offloaded,
        "reason": item.reason,
        "tokens": item.tokens,
        "tokens_exact": item.tokens_exact,
        "inline_tokens": item.inline_tokens,
        "bytes": artifact.bytes if artifact else len(item.text.encode()),
        "sha256": artifact.sha256 if artifact else None,
        "path": artifact.path if artifact else None,
        "text": item.text,
    }


def _exec(args: argparse.Namespace) -> int:
    code = sys.stdin.read() if args.code == "-" else args.code
    with _harness(args) as harness, _task(args, harness) as task:
        result = task.exec(
            args.lang,
            code,
            timeout=args.timeout,
            artifact=args.artifact,
            session=args.session,
            reset_session=args.reset_session,
        )
    if args.json:
        print(json.dumps(result.as_json(), ensure_ascii=False))
    else:
        sys.stdout.write(
            result.text if result.text.endswith("\n") or not result.text else result.text + "\n"
        )
        sys.stderr.write(result.stderr)
        if result.timed_out:
            print(
                f"spillbox: the script timed out after {args.timeout:g} s and was killed",
                file=sys.stderr,
            )
        for artifact in result.files:
            print(f"spillbox: stored {artifact.path} ({artifact.bytes} bytes)", file=sys.stderr)
        for note in result.file_notes:
            print(f"spillbox: {note}", file=sys.stderr)
    return result.exit_code if 0 <= result.exit_code < 256 else 1


def _tasks(args: argparse.Namespace) -> int:
    with _harness(args) as harness:
        rows = harness.catalog.tasks()
        data = []
        for row in rows:
            live = harness.catalog.artifacts(row.task_id)
            data.append(
                {
                    "task": row.task_id,
                    "state": row.state,
                    "created": _iso(row.created_at),
                    "closed": _iso(row.closed_at),
                    "delete_after": _iso(row.delete_after),
                    "artifacts": len(live),
                    "bytes": sum(a.bytes for a in live),
                    "retention": json.loads(row.retention),
                }
            )
    lines = [
        f"{_field(d['task'])}\t{d['state']}\t{d['artifacts']} artifacts\t{d['bytes']} bytes"
        for d in data
    ]
    _print(args, data, "\n".join(lines) if lines else "no tasks")
    return 0


def _rm(args: argparse.Namespace) -> int:
    with _harness(args) as harness:
        held = harness.remove(args.task)
    text = f"removed task {_field(args.task)}"
    if held:
        text += f"; {held} pinned artifacts kept under legal hold (unpin, then rm again)"
    _print(args, {"removed": args.task, "pinned_kept": held}, text)
    return 0


def _artifact_json(row: ArtifactRow) -> dict[str, Any]:
    return {
        "id": row.artifact_id,
        "call_id": row.call_id,
        "tool": row.tool,
        "path": row.path,
        "bytes": row.bytes,
        "tokens": row.tokens,
        "sha256": row.sha256,
        "created": _iso(row.created_at),
        "last_access": _iso(row.last_access_at),
        "expires": _iso(row.expires_at),
        "state": row.state,
        "pinned": row.pinned,
        "redactions": row.redactions,
        "deleted": _iso(row.deleted_at),
        "deleted_by": row.deleted_by,
    }


def _artifacts(args: argparse.Namespace) -> int:
    with _harness(args) as harness:
        harness.catalog.known_task(args.task, deleted_too=True)
        rows = harness.catalog.artifacts(args.task, include_deleted=args.all)
    data = [_artifact_json(row) for row in rows]
    lines = [
        f"{_field(d['id'])}\t{d['state']}{' pinned' if d['pinned'] else ''}\t{d['bytes']} bytes\t"
        f"{_field(d['path'])}\texpires {d['expires'] or 'never'}"
        for d in data
    ]
    _print(args, data, "\n".join(lines) if lines else "no artifacts")
    return 0


def _export(args: argparse.Namespace) -> int:
    with _harness(args) as harness, harness.existing(args.task) as task:
        target = task.export(args.artifact, args.dest, actor=f"cli:{getpass.getuser()}")
    _print(args, {"exported": args.artifact, "dest": str(target)}, f"exported to {target}")
    return 0


def _pin(args: argparse.Namespace) -> int:
    with _harness(args) as harness, harness.existing(args.task) as task:
        actor = f"cli:{getpass.getuser()}"
        row = task.pin(args.artifact, actor) if args.pinned else task.unpin(args.artifact, actor)
    word = "pinned" if row.pinned else "unpinned"
    _print(args, _artifact_json(row), f"{word} {_field(row.artifact_id)}")
    return 0


def _gc(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from spillbox.config import Settings

    settings = Settings.from_env()
    home = settings.home if args.home is None else Path(args.home).expanduser()
    if settings.catalog_url is None and not home.is_dir():
        # Opening a harness would make the home: a dry run changes nothing, and a home
        # that is not there (a typo, most often) has nothing to collect.
        raise ConfigError(
            f"no spillbox home at {home}: nothing to collect; check --home or SPILLBOX_HOME"
        )
    with _harness(args) as harness:
        removals = harness.gc(dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    data = [asdict(r) for r in removals]
    lines = [f"{verb} {r.kind} {_field(r.what)} ({r.reason})" for r in removals]
    _print(args, data, "\n".join(lines) if lines else "nothing to remove")
    return 0


def _audit(args: argparse.Namespace) -> int:
    with _harness(args) as harness:
        harness.catalog.known_task(args.task, deleted_too=True)
        entries = harness.catalog.audit(args.task)
    data = [
        {
            "at": _iso(e.at),
            "action": e.action,
            "artifact": e.artifact_id,
            "actor": e.actor,
            "detail": e.detail,
        }
        for e in entries
    ]
    lines = [
        f"{d['at']}\t{d['action']}\t{_field(d['artifact'])}\t{_field(d['actor'])}\t"
        f"{_field(d['detail'])}"
        for d in data
    ]
    _print(args, data, "\n".join(lines) if lines else "no entries")
    return 0


def _tools(args: argparse.Namespace) -> int:
    from spillbox.tools import SPECS, tool_names

    names = tool_names(() if args.sandbox == "none" else LANGS)
    specs = [SPECS[name] for name in names]
    print(json.dumps([spec.definition(args.format) for spec in specs], indent=2))
    return 0


def _call(args: argparse.Namespace) -> int:
    from spillbox.tools import Toolset

    with _harness(args) as harness, harness.task(args.task) as task:
        toolset = Toolset(task)
        task.register_tools(toolset.names)
        output = toolset.call(args.tool, args.arguments)
    print(output.text)
    return 1 if output.is_error else 0


def _mcp(args: argparse.Namespace) -> int:
    from spillbox import mcp
    from spillbox.harness import Harness

    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if args.command is not None and bool(args.command) == bool(args.url):  # proxy
        raise ConfigError(
            "give the server to run after --, or --url for one that speaks streamable HTTP "
            "(one of the two)"
        )
    timeout = args.upstream_timeout
    upstream = {
        "timeout": mcp.DEFAULT_UPSTREAM_TIMEOUT_SECONDS if timeout is None else timeout or None,
        "bound": mcp.STEP_BOUND_SECONDS if args.step_bound is None else args.step_bound,
        "url": args.url,
        "start_timeout": args.upstream_start_timeout or mcp.UPSTREAM_START_SECONDS,
    }
    listen = None
    if args.listen:
        most = mcp.DEFAULT_MAX_SESSIONS if args.max_sessions is None else args.max_sessions
        listen = mcp.parse_listen(args.listen, args.allow_origin, most)
    # A long-lived server: garbage collection runs in the background, as in a harness. Over
    # stdio it serves one task: a warm pool would start containers no task takes.
    pool_size = args.pool_size if listen is not None else 0
    with Harness(
        sandbox=args.sandbox,
        home=args.home,
        pool_size=pool_size,
        cluster=args.cluster,
        long_lived=True,
    ) as harness:
        if listen is None:
            with _task(args, harness, args.task or mcp.new_task_id()) as task:
                mcp.run(task, args.command, **upstream)
            return 0
        session_timeout = args.session_timeout or mcp.DEFAULT_SESSION_TIMEOUT_SECONDS
        mcp.run_http(
            listen,
            lambda name: _task(args, harness, name or mcp.new_task_id()),
            args.command,
            session_timeout=session_timeout,
            task=args.task,
            **upstream,
        )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from spillbox.demo import run_demo

    return run_demo(home=args.home)


def _image_build(args: argparse.Namespace) -> int:
    from rich.console import Console

    from spillbox.sandbox.docker import connect
    from spillbox.sandbox.image import build_image, image_present, image_size, image_tag

    client = connect()
    started = time.monotonic()
    if image_present(client) and not args.force:
        tag, how = image_tag(), "already built"
    elif args.quiet:
        tag, how = build_image(client, base=args.base), "built"
    else:
        with BuildView(Console(stderr=True)) as view:
            tag = build_image(client, base=args.base, progress=view.show)
        how = f"built in {_duration(time.monotonic() - started)}"
    print(f"{tag} {image_size(client, tag) / 1e6:.0f} MB ({how})")
    return 0


class BuildView:
    """The image build's events on a console: each step's start and end as a line (the end
    with the step's elapsed time), and while steps run, one spinner each with its latest line.

    >>> with BuildView(Console(stderr=True)) as view:  # doctest: +SKIP
    ...     build_image(client, progress=view.show)
    """

    def __init__(self, console: Any, clock: Callable[[], float] = time.monotonic) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._console = console
        self._clock = clock
        self._live = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.fields[step]}[/]"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,  # a log gets the step lines alone
        )
        self._running: dict[str, tuple[Any, float]] = {}
        self._lock = threading.Lock()  # the build's two stages report from two threads

    def __enter__(self) -> BuildView:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def show(self, event: BuildEvent) -> None:
        from rich.markup import escape

        with self._lock:
            if event.kind == "start":
                self._console.print(f"[bold]{event.step}[/]: {escape(event.text)}")
                task = self._live.add_task(escape(event.text[:80]), step=event.step)
                self._running[event.step] = (task, self._clock())
            elif event.kind == "output" and event.step in self._running:
                self._live.update(self._running[event.step][0], description=escape(event.text[:80]))
            elif event.kind == "done":
                elapsed = ""
                if event.step in self._running:
                    task, started = self._running.pop(event.step)
                    self._live.remove_task(task)
                    elapsed = f" [dim]({_duration(self._clock() - started)})[/]"
                line = f"[green]✓[/] [bold]{event.step}[/]: {escape(event.text)}{elapsed}"
                self._console.print(line)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


if __name__ == "__main__":
    raise SystemExit(main())
