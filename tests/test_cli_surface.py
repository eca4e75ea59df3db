"""The command line's surface: every command has its handler and its help, and the README's
usage lines name only commands and options the parser has (and every command has one)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from spillbox import cli

README = Path(__file__).resolve().parent.parent / "README.md"
COMMON_FLAGS = {"--home", "--sandbox", "--cluster", "--json"}
"""The flags of every command that opens a harness."""
OPENS_NO_HARNESS = {"host", "tools", "demo", "image build"}
"""Commands with flags of their own in place of COMMON_FLAGS (host: a node's home)."""


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each command that runs ("mcp proxy", "image build", ...) with its parser."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups and path:
        yield " ".join(path), parser
    for group in groups:
        for name, sub in group.choices.items():
            yield from commands(sub, (*path, name))


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


SURFACE = dict(commands(cli._parser()))


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_each_command_has_a_handler_and_help_naming_its_options(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = SURFACE[name]
    handler = parser.get_default("func")
    assert callable(handler) and getattr(cli, handler.__name__) is handler
    with pytest.raises(SystemExit) as done:
        cli.main([*name.split(), "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"usage: spillbox {name} ")
    for flag in options(parser):
        assert re.search(rf"(^|[\s\[,]){re.escape(flag)}\b", shown), (name, flag)
    if name not in OPENS_NO_HARNESS:
        assert COMMON_FLAGS <= options(parser), name


def readme_usage() -> Iterator[tuple[str, set[str]]]:
    """Each usage of the README as the command it names and the --flags it shows before a
    `--` (the words after it are another program's)."""
    for usage in _usages():
        words = usage.split()
        upstream = [i for i, word in enumerate(words) if word in ("--", "[--]")]
        before = " ".join(words[: upstream[0]] if upstream else words)
        yield _command_named(usage), set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", before))


def _usages() -> Iterator[str]:
    """Each `spillbox COMMAND ...` in the README's code blocks, with the indented lines that
    continue it (`a / b` on one line: two usages)."""
    fenced = False
    current: list[str] = []
    for line in README.read_text().splitlines():
        fenced = fenced != line.startswith("```")
        parts = [part.strip() for part in line.split(" / ")]
        starts = [part for part in parts if fenced and re.match(r"spillbox [a-z]", part)]
        if current and (starts or not fenced or not line.startswith(" ")):
            yield " ".join(current)
            current = []
        if starts:
            yield from starts[:-1]
            current = [starts[-1]]
        elif current:
            current.append(line)
    if current:
        yield " ".join(current)


def _command_named(usage: str) -> str:
    """The longest command `spillbox ...` begins with (or the word after spillbox)."""
    words = usage.split()
    for size in (2, 1):
        name = " ".join(words[1 : 1 + size])
        if name in SURFACE:
            return name
    return words[1]


def test_the_readme_shows_every_command_and_only_options_that_exist() -> None:
    shown = list(readme_usage())
    assert shown, "the README has its command-line usage in code blocks"
    for name, flags in shown:
        assert name in SURFACE, f"the README shows `spillbox {name}`, which the CLI lacks"
        assert flags <= options(SURFACE[name]), (name, flags - options(SURFACE[name]))
    missing = set(SURFACE) - {name for name, _ in shown}
    assert not missing, f"commands the README's usage lines do not show: {sorted(missing)}"
