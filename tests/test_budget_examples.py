"""The budget examples run as a user would run them, and say what they promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300
    )


def test_a_long_session_stays_inside_32k_natively_and_with_the_fallback() -> None:
    done = run_example("long_session.py")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    native, fallback = out.split("== fallback")
    assert "plan: clear_tool_uses" in native and "context-management-2025-06-27" in native
    assert '"compact_threshold": 21760' in native  # what gpt-5.4 would get
    assert "plan: fallback" in fallback
    for session in (native, fallback):
        steps = re.findall(r"^step +(\d+): (.*)$", session, re.MULTILINE)
        assert len(steps) == 46  # a report before each of 46 model calls
        assert all("!!" not in line for _, line in steps)  # no route over its hard limit
        assert "archive:" in session and "tool_results:" in session
        assert "answer: Read 45 pages" in session
    assert "tool results stored first" in native


def test_a_budget_too_small_for_the_system_prompt_fails_loudly() -> None:
    done = run_example("budget_too_small.py")
    assert done.returncode == 1
    assert "BudgetExceeded: the 'system' route uses" in done.stderr
    assert "over its hard limit of 300" in done.stderr and "raise routes['system']" in done.stderr
