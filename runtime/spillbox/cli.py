"""The command line: each command parses, makes one library call, and prints."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spillbox.codemode import LANGS
from spillbox.config import SandboxKind
from spillbox.errors import ConfigError, SpillboxError
from spillbox.gate import ToolResult
from spillbox.harness import Admitted, Harness


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spillbox", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--home", help="spillbox home (default: SPILLBOX_HOME or the user data dir)"
    )
    common.add_argument(
        "--sandbox", choices=["none", "docker"], help="sandbox kind (default: docker)"
    )
    common.add_argument("--json", action="store_true", help="machine-readable output")

    offload = commands.add_parser(
        "offload", parents=[common], help="admit files as one step's tool results"
    )
    offload.add_argument("--task", required=True)
    offload.add_argument("--tool", help="tool name (default: each file's stem)")
    offload.add_argument("files", nargs="+", metavar="FILE")
    offload.set_defaults(func=_offload)

    exec_ = commands.add_parser("exec", parents=[common], help="run a code-mode script")
    exec_.add_argument("--task", required=True)
    exec_.add_argument("--lang", required=True, choices=LANGS)
    exec_.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    exec_.add_argument("--artifact", help="the artifact a jq filter runs over (id or file name)")
    exec_.add_argument("code", metavar="CODE", help="the script, or - to read it from stdin")
    exec_.set_defaults(func=_exec)

    tasks = commands.add_parser("tasks", parents=[common], help="list tasks")
    tasks.set_defaults(func=_tasks)

    rm = commands.add_parser("rm", parents=[common], help="delete a task: sandbox and storage")
    rm.add_argument("task", metavar="TASK")
    rm.set_defaults(func=_rm)

    image = commands.add_parser("image", help="the sandbox image")
    image_commands = image.add_subparsers(required=True, metavar="ACTION")
    build = image_commands.add_parser("build", help="build the sandbox image if missing")
    build.add_argument("--base", choices=["auto", "registry", "debootstrap"], default="auto")
    build.add_argument("--force", action="store_true", help="rebuild even if present")
    build.set_defaults(func=_image_build)
    return parser


def _harness(args: argparse.Namespace) -> Harness:
    sandbox: SandboxKind | None = args.sandbox
    return Harness(sandbox=sandbox, home=args.home)


def _offload(args: argparse.Namespace) -> int:
    results = []
    for name in args.files:
        path = Path(name)
        try:
            content = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"cannot read {name}: {e.strerror}") from None
        results.append(ToolResult(call_id=path.name, tool=args.tool or path.stem, content=content))
    with _harness(args).task(args.task) as task:
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
    task = _harness(args).task(args.task)
    result = task.exec(args.lang, code, timeout=args.timeout, artifact=args.artifact)
    if args.json:
        print(
            json.dumps(
                {
                    "exit_code": result.exit_code,
                    "text": result.text,
                    "stderr": result.stderr,
                    "offloaded": result.offloaded,
                    "path": result.path,
                    "timed_out": result.timed_out,
                    "oom_killed": result.oom_killed,
                },
                ensure_ascii=False,
            )
        )
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
    return result.exit_code if 0 <= result.exit_code < 256 else 1


def _tasks(args: argparse.Namespace) -> int:
    ids = _harness(args).tasks()
    print(json.dumps(ids) if args.json else "\n".join(ids))
    return 0


def _rm(args: argparse.Namespace) -> int:
    _harness(args).remove(args.task)
    print(json.dumps({"removed": args.task}) if args.json else f"removed task {args.task}")
    return 0


def _image_build(args: argparse.Namespace) -> int:
    from rich.console import Console

    from spillbox.sandbox.docker import connect
    from spillbox.sandbox.image import build_image, image_present, image_tag

    console = Console(stderr=True)
    client = connect()
    if image_present(client) and not args.force:
        print(image_tag())
        return 0
    with console.status("building the sandbox image") as status:
        tag = build_image(client, base=args.base, progress=lambda line: status.update(line[:100]))
    print(tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
