"""Run every benchmark in one process and write BENCHMARKS.md at the repo root.

Every figure in the report comes from the one run that writes it, ratios of ours against
a raw floor measured alongside.

    python benchmarks/run.py             # full run (what `make bench` does), a few minutes
    python benchmarks/run.py --quick     # a smoke run: the report on stdout, no file written
    python benchmarks/run.py --output -  # full run, the report on stdout
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import budget_bench
import common
import gate_bench
import history_bench
import integrations_bench
import mcp_bench
import ray_bench
import sandbox_bench
import startup_bench

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "BENCHMARKS.md"


def report(quick: bool) -> str:
    """Run every bench and return BENCHMARKS.md's text."""
    machine = common.machine()  # first, so its load average is the load at the start
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    gate = gate_bench.run(quick)
    sandbox = sandbox_bench.run(quick)
    mcp = mcp_bench.run(quick)
    budget = budget_bench.run(quick)
    history = history_bench.run(quick)
    startup = startup_bench.run(quick)
    integrations = integrations_bench.run(quick)
    cluster = ray_bench.run(quick)
    load_start, load_end = machine["load average (1 / 5 / 15 min)"], common.load_average()
    cores = machine["cores"]
    kind = "a quick smoke run (smaller inputs, fewer repetitions)" if quick else "a full run"
    return "\n".join(
        [
            "# Benchmarks",
            "",
            f"Written by `benchmarks/run.py`, {kind}, on {started} at {_revision()}. "
            "Every figure below comes from that one run. Read the ratios, ours against a "
            "raw floor measured in the same run: absolute times move with the machine's load.",
            "",
            "## Machine",
            "",
            common.machine_markdown(machine),
            "",
            f"Load average (1 / 5 / 15 min) {load_start} at the start of the run and "
            f"{load_end} at its end, on {cores} cores. This is a shared machine: other work "
            "slows ours and the floor alike, so the ratios hold better than any absolute time.",
            "",
            "## Rerun",
            "",
            "```sh",
            "make bench                        # sets up what is missing, then runs run.py",
            "python benchmarks/run.py          # the same, with spillbox installed",
            "python benchmarks/run.py --quick  # a smoke run: prints, leaves this file alone",
            "python benchmarks/gate_bench.py   # one bench alone (also sandbox_bench.py,",
            "                                  # mcp_bench.py, budget_bench.py, history_bench.py,",
            "                                  # startup_bench.py, integrations_bench.py,",
            "                                  # ray_bench.py)",
            "```",
            "",
            "## Gate: decide and store against a full count",
            "",
            'Task.admit of pretty-printed JSON (sandbox "none", a fresh task per run) '
            "against a full tiktoken count of the same text, the least a gate that counts "
            "everything pays.",
            "",
            gate_bench.markdown(gate),
            "",
            "## Docker sandbox",
            "",
            sandbox_bench.markdown(sandbox),
            "",
            "## MCP proxy",
            "",
            "`spillbox mcp proxy` in front of tests/mcp/toy_server.py (a server of the "
            "official SDK's), against calling that server directly, both from the SDK's "
            "client over stdio.",
            "",
            mcp_bench.markdown(mcp),
            "",
            "## Budget: a check after one new message",
            "",
            "Budget.check of a long Chat Completions conversation, first whole, then after "
            "one new message (the counts of every other text remembered by content).",
            "",
            budget_bench.markdown(budget),
            "",
            "## History: a recorded session on disk",
            "",
            "A session run with record_turns=True and the fallback compactor (sandbox "
            '"none"), its history appended to once per step and per archive: the bytes its '
            "history files hold against the history a reader gets back.",
            "",
            history_bench.markdown(history),
            "",
            "## Start-up: a fresh process",
            "",
            "The command line and `import spillbox` in a new interpreter each, against the "
            "same interpreter doing nothing.",
            "",
            startup_bench.markdown(startup),
            "",
            "## Framework integrations: a small inline tool call",
            "",
            "Each framework's own tool-calling path with a small tool (left inline), without "
            "spillbox and with its integration, driven by an offline model (the Claude Agent "
            "SDK's CLI by a local fake Messages API).",
            "",
            integrations_bench.markdown(integrations),
            "",
            "## Ray cluster: a head and two more nodes on this machine",
            "",
            "spillbox hosts on a local three-node Ray cluster (tests/ray_cluster.py), the "
            "catalog on Postgres, against one machine with no cluster.",
            "",
            ray_bench.markdown(cluster),
            "",
            "## Targets",
            "",
            common.targets_markdown(
                gate_bench.targets(gate)
                + sandbox_bench.targets(sandbox)
                + mcp_bench.targets(mcp)
                + budget_bench.targets(budget)
                + history_bench.targets(history)
                + startup_bench.targets(startup)
                + integrations_bench.targets(integrations)
                + ray_bench.targets(cluster)
            ),
            "",
            f"Measured under a load average of {load_start} (start) and {load_end} (end) on "
            f"{cores} cores; the absolute target (4 KB inline under 2 ms) is the one that "
            "load moves most.",
            "",
        ]
    )


def _revision() -> str:
    """The commit measured, and whether the working tree differed from it."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"
    return f"commit {commit}" + (" with uncommitted changes" if dirty else "")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run with small inputs")
    parser.add_argument(
        "--output",
        help=f"where to write the report, - for stdout (default: {REPORT.name} for a full "
        "run, stdout for --quick)",
    )
    args = parser.parse_args(argv)
    text = report(args.quick)
    output = args.output or ("-" if args.quick else str(REPORT))
    if output == "-":
        print(text, end="")
    else:
        Path(output).write_text(text)
        print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
