"""`spillbox image build` shows its steps, what each made and how long it took, then one line
with the image's tag and size; --quiet prints that line alone."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from spillbox.cli import BuildView, main
from spillbox.sandbox.image import BuildEvent

FINAL_LINE = re.compile(r"spillbox-sandbox:[0-9a-f]{16} \d+ MB \((built in [^)]+|built)\)")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_view_prints_each_step_with_what_it_made_and_its_time() -> None:
    out = io.StringIO()
    clock = Clock()
    console = Console(file=out, width=200, color_system=None)
    with BuildView(console, clock) as view:
        view.show(BuildEvent("wheels", "done", "14 wheels, in the cache"))
        view.show(BuildEvent("base", "start", "mmdebstrap bookworm (python3)"))
        view.show(BuildEvent("base", "output", "I: extracting archives..."))
        clock.now += 61.2
        view.show(BuildEvent("base", "done", "spillbox-base:abc, 220 MB"))
        # The two stages overlap: each keeps its own start time.
        view.show(BuildEvent("stage build", "start", "building the build stage"))
        clock.now += 2
        view.show(BuildEvent("stage venv", "start", "building the venv stage"))
        clock.now += 3.5
        view.show(BuildEvent("stage venv", "done", "venv stage"))
        clock.now += 10
        view.show(BuildEvent("stage build", "done", "build stage"))
        view.show(BuildEvent("prune", "done", "removed outdated image [x]"))
    assert out.getvalue().splitlines() == [
        "✓ wheels: 14 wheels, in the cache",
        "base: mmdebstrap bookworm (python3)",
        "✓ base: spillbox-base:abc, 220 MB (1 min 01 s)",
        "stage build: building the build stage",
        "stage venv: building the venv stage",
        "✓ stage venv: venv stage (3.5 s)",
        "✓ stage build: build stage (15.5 s)",
        "✓ prune: removed outdated image [x]",  # markup in a text is printed as is
    ]


@pytest.mark.docker
def test_a_build_shows_its_steps_and_ends_with_the_tag_and_size(
    sandbox_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The image exists: --force rebuilds it from the build cache, every step reported.
    assert main(["image", "build", "--force"]) == 0
    captured = capsys.readouterr()
    [line] = captured.out.splitlines()
    assert FINAL_LINE.fullmatch(line)
    assert line.startswith(f"{sandbox_image} ") and "built in" in line
    steps = " ".join(captured.err.split())  # the console wraps long lines
    for done in ("wheels", "jq source", "base", "stage build", "stage venv"):
        assert f"✓ {done}: " in steps
    assert re.search(rf"✓ image: {sandbox_image} \([0-9.]+ s\)", steps)


@pytest.mark.docker
def test_quiet_prints_only_the_final_line(
    sandbox_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["image", "build", "--force", "--quiet"]) == 0
    built = capsys.readouterr()
    assert built.err == ""
    [line] = built.out.splitlines()
    assert FINAL_LINE.fullmatch(line) and line.startswith(f"{sandbox_image} ")
    assert main(["image", "build", "--quiet"]) == 0  # present: nothing to build
    present = capsys.readouterr()
    assert present.err == ""
    assert present.out == f"{line.split(' (')[0]} (already built)\n"
