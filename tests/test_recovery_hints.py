"""No notice without a way back (issue 25 item 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from spillbox import Harness, parse_notice
from spillbox.tools import Toolset
from spillbox.types import ToolResult

SPILLBOX = Path(sys.executable).parent / "spillbox"


def hints(text: str) -> list[str]:
    fields = parse_notice(text)
    assert fields is not None, text
    return fields["hint"].splitlines() if "hint" in fields else []


def test_a_store_only_notice_without_tools_names_a_route_that_works(home: Path) -> None:
    payload = "".join(f"line {i}: 'quoted' \"twice\" $HOME `x`\n" for i in range(4000))
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        # A task id a shell would split or expand: the hint quotes it.
        with harness.task("it's $HOME") as task:
            [admitted] = task.admit([ToolResult("c 1", "dump", payload)])
            assert admitted.offloaded
            [hint] = hints(admitted.text)
            lang, _, command = hint.partition(": ")
            assert lang == "cli" and command.startswith("spillbox call --sandbox none ")
            # Run it as whoever runs the harness would, against the same store.
            done = subprocess.run(
                ["sh", "-c", command.replace("spillbox", str(SPILLBOX), 1)],
                env={**os.environ, "SPILLBOX_HOME": str(home)},
                capture_output=True,
                text=True,
                timeout=120,
            )
    assert done.returncode == 0, done.stderr
    page = json.loads(done.stdout)
    assert page["artifact_id"] == admitted.artifact.id  # type: ignore[union-attr]
    assert payload.startswith(page["text"])


def test_a_toolset_registers_its_tools_with_the_task(home: Path) -> None:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("t") as task:
            Toolset(task, register=False)
            assert task.tools == frozenset()
            toolset = Toolset(task)
            assert task.tools == frozenset(toolset.names)
            [admitted] = task.admit([ToolResult("c1", "dump", "x\n" * 20_000)])
    [hint] = hints(admitted.text)
    name, _, args = hint.partition(" ")
    assert name == "read_artifact" and json.loads(args) == {"path": admitted.artifact.path}  # type: ignore[union-attr]
