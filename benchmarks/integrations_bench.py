"""Framework integrations benchmark: what each integration adds to a small inline tool call,
against the same framework without spillbox, in one run (issue 26 item 6).

Each framework's own tool-calling path runs with a small tool (a few bytes, left inline),
without spillbox and with it, the sides alternated in rotating order so that load hits them
alike; the table gives each side's median and what spillbox adds. spillbox's task is on the
"none" sandbox: a small inline result never reaches the sandbox, so this measures the
integration and the gate, not Docker. Each framework's measurement lives in
benchmarks/frameworks/<framework>.py, its docstring saying what it runs; the shared part
(the row, the alternation) in benchmarks/frameworks/__init__.py.

Target: the median added to a small inline call under 1 ms, judged on each framework's rows
of what a user's call pays (Claude Agent SDK: its hooks in process, the CLI end to end being
too noisy to judge; PydanticAI: per call). The other rows explain those.

    python benchmarks/integrations_bench.py           # full run, a few minutes
    python benchmarks/integrations_bench.py --quick   # a smoke run: fewer calls
"""

from __future__ import annotations

import sys

from common import Target, bench_main
from frameworks import Row, claude_agent, google_adk, langchain, openai_agents, pydantic_ai

FRAMEWORKS = (langchain, pydantic_ai, openai_agents, claude_agent, google_adk)
ADDED_MS_MAX = 1.0


def run(quick: bool) -> list[Row]:
    return [row for framework in FRAMEWORKS for row in framework.rows(quick)]


def _ratio(row: Row) -> str:
    """The ratio, where the side without spillbox took measurable time."""
    return f" ({row.spillbox_ms / row.bare_ms:.2f}x)" if row.bare_ms >= 0.01 else ""


def markdown(rows: list[Row]) -> str:
    lines = [
        "| framework | path | without spillbox (median ms) | with spillbox | added | samples "
        "a side | target |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r.framework} | {r.path} | {r.bare_ms:.3f} | {r.spillbox_ms:.3f} | "
        f"{r.added_ms:+.3f} ms{_ratio(r)} | {r.samples} | {'judged' if r.judged else 'context'} |"
        for r in rows
    ]
    lines += ["", "What the rows run:", ""]
    lines += [f"- {framework.FRAMEWORK}: {framework.NOTE}" for framework in FRAMEWORKS]
    return "\n".join(lines)


def targets(rows: list[Row]) -> list[Target]:
    return [
        Target(
            f"{r.framework}, {r.path}: median added to a small inline call under "
            f"{ADDED_MS_MAX:g} ms",
            r.added_ms < ADDED_MS_MAX,
            f"{r.added_ms:+.3f} ms{_ratio(r)}",
        )
        for r in rows
        if r.judged
    ]


if __name__ == "__main__":
    sys.exit(bench_main(run, markdown, targets, sys.argv[1:]))
