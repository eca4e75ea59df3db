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
        assert "tool_results:" in session
        assert "answer: Read 45 pages" in session
        # Issue 25 item 8: the conversation shares the window, so no compaction runs before
        # a request fills 70% of what the window leaves after the output reserve.
        first = re.search(r"first compaction ran after a request of ([\d,]+) tokens", session)
        assert first is not None, session
        assert int(first.group(1).replace(",", "")) >= 0.7 * 27_200
    assert "tool results stored first" in native
    # Issue 25 items 3 and 4: every turn of the native session is in one history.
    found = re.search(r"the task's history: (\d+) turns in 1 artifact", native)
    assert found is not None, native
    assert int(found.group(1)) >= 2 + 2 * 45 + 1  # system, task, 45 calls and results, answer
