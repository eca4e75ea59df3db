"""History storage benchmark: what a 40-step session's history costs on disk.

The session of issue 25 (40 steps of ~2,000-token build logs in a 32k window, every turn
recorded with record_turns=True, the fallback compactor archiving older turns) appends to
the task's history once per step and once per archive. Measured in one run:

- stored: the bytes of every history payload file left in the task's storage;
- final: the size of the history as it ends (what a reader gets back);
- the ratio stored / final. Appending in place stores each byte once: 1.0. A history
  rewritten whole on every append stores a copy per append, growing with the square of
  the session's length.

Target (issue 25 item 3): stored at most twice the final size.

    python benchmarks/history_bench.py            # also part of benchmarks/run.py
    python benchmarks/history_bench.py --quick    # a 10-step session
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import common
from common import Target
from spillbox import Harness, loop
from spillbox.budget import Budget
from spillbox.history import HISTORY_REF, HISTORY_TOOL
from spillbox.loop import UserTool

# The session the history tests run (tests/test_history.py), measured here.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_history import LOGS, log_tool, steps  # noqa: E402

STEPS = 40
WINDOW = 32_000
TARGET_RATIO = 2.0


def measure(home: Path, count: int = STEPS) -> tuple[int, int, int]:
    """(bytes stored in history files, the final history's size, history rows listed)."""
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("forty") as task:
            budget = Budget(window=WINDOW, share_room=False)
            loop.run(task, steps(count), "Read the logs.", [UserTool(LOGS, log_tool)],
                max_steps=count + 5, budget=budget, record_turns=True)  # fmt: skip
            rows = [row for row in task.artifacts() if row.tool == HISTORY_TOOL]
            stored = sum((task.storage.offload / row.name).stat().st_size for row in rows)
            return stored, len(task.read(HISTORY_REF)), len(rows)


def run(quick: bool = False) -> dict[str, Any]:
    """The session's history on disk (a 10-step session for a quick run)."""
    steps_run = 10 if quick else STEPS
    with tempfile.TemporaryDirectory() as scratch:
        stored, final, rows = measure(Path(scratch), steps_run)
    return {"steps": steps_run, "stored": stored, "final": final, "files": rows}


def markdown(results: dict[str, Any]) -> str:
    r = results
    return "\n".join(
        [
            "| steps | history files | bytes stored | final history (bytes) | ratio |",
            "|---:|---:|---:|---:|---:|",
            f"| {r['steps']} | {r['files']} | {r['stored']:,} | {r['final']:,} | "
            f"{r['stored'] / r['final']:.2f} |",
        ]
    )


def targets(results: dict[str, Any]) -> list[Target]:
    ratio = results["stored"] / results["final"]
    return [
        Target(
            goal=f"a {results['steps']}-step session's history stores at most "
            f"{TARGET_RATIO:g}x its final size",
            met=ratio <= TARGET_RATIO,
            measured=f"{ratio:.2f}x: {results['stored']:,} bytes in {results['files']} "
            f"file(s) for {results['final']:,}",
        )
    ]


if __name__ == "__main__":
    raise SystemExit(common.bench_main(run, markdown, targets, sys.argv[1:]))
