"""Start-up benchmark: what the command line and `import spillbox` cost a fresh process.

Each command runs in a new interpreter, as a user or a script starts it; the floor is the
same interpreter doing nothing (`python -c pass`), started the same way in the same run.
Medians of fresh runs, alternated so that load moves ours and the floor alike:

- `import spillbox`: the package and its public names, nothing used;
- `spillbox --version`;
- `spillbox call --task T list_artifacts`: a real call on a store-only task (sandbox
  "none", a home of its own), the catalog opened and the tool answered.

Targets (issue 24 item 3): --version at most 150 ms, import at most 250 ms, the call at
most 400 ms.

    python benchmarks/startup_bench.py           # full run, a few seconds
    python benchmarks/startup_bench.py --quick   # a smoke run
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from common import Target

SPILLBOX = str(Path(sys.executable).with_name("spillbox"))
TARGETS_MS = {"import": 250.0, "version": 150.0, "call": 400.0}


def _commands(home: str) -> dict[str, list[str]]:
    return {
        "floor": [sys.executable, "-c", "pass"],
        "import": [sys.executable, "-c", "import spillbox"],
        "version": [SPILLBOX, "--version"],
        "call": [
            SPILLBOX,
            "call",
            "--home",
            home,
            "--sandbox",
            "none",
            "--task",
            "T",
            "list_artifacts",
            "{}",
        ],
    }


_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""A user's environment: bytecode written once and read after (a developer's
PYTHONDONTWRITEBYTECODE=1 made every changed module compile again in every process)."""


def _once(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=_ENV)
    return time.perf_counter() - started


def run(quick: bool) -> dict[str, Any]:
    runs = 3 if quick else 15
    with tempfile.TemporaryDirectory() as home:
        commands = _commands(home)
        for command in commands.values():  # warm the page cache and the .pyc files
            _once(command)
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, command in commands.items():
                samples[name].append(_once(command))
    return {"runs": runs, **{name: common.median_ms(s) for name, s in samples.items()}}


_LABELS = {
    "import": "`python -c 'import spillbox'`",
    "version": "`spillbox --version`",
    "call": "`spillbox call --task T list_artifacts` (store-only task)",
}


def markdown(results: dict[str, Any]) -> str:
    r = results
    rows = [
        f"| {_LABELS[name]} | {r[name]:.0f} ms | {r['floor']:.0f} ms | {r[name] / r['floor']:.2f} "
        f"| {r[name] - r['floor']:.0f} ms |"
        for name in TARGETS_MS
    ]
    return "\n".join(
        [
            "| command | ours | floor (`python -c pass`) | ratio | added |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"Medians of {r['runs']} fresh processes each, alternated with the floor.",
        ]
    )


def targets(results: dict[str, Any]) -> list[Target]:
    r = results
    return [
        Target(
            goal=f"{_LABELS[name]} at most {limit:g} ms",
            met=r[name] <= limit,
            measured=f"{r[name] / r['floor']:.2f}x the interpreter's start: {r[name]:.0f} ms "
            f"against {r['floor']:.0f} ms",
        )
        for name, limit in TARGETS_MS.items()
    ]


if __name__ == "__main__":
    raise SystemExit(common.bench_main(run, markdown, targets, sys.argv[1:]))
