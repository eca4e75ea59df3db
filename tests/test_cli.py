"""`spillbox offload`: files admitted as one step, printed as text or JSON lines; and the top
level: `spillbox --version`, and `spillbox --help` with a first command to try."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from spillbox import Harness
from spillbox.cli import _parser, main
from spillbox.notice import parse_notice

ROOT = Path(__file__).resolve().parent.parent
PR_ROWS = [{"id": i, "title": f"PR {i}", "body": "text of the change " * 40} for i in range(400)]

JSON_KEYS = [
    "call_id",
    "tool",
    "offloaded",
    "reason",
    "tokens",
    "tokens_exact",
    "inline_tokens",
    "bytes",
    "sha256",
    "path",
    "text",
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads SPILLBOX_* from the process: start every test from none."""
    for name in list(os.environ):
        if name.startswith("SPILLBOX_"):
            monkeypatch.delenv(name)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "big": tmp_path / "list_prs.json",
        "small": tmp_path / "echo.txt",
        "png": tmp_path / "image.png",
    }
    paths["big"].write_text(json.dumps(PR_ROWS, indent=2))
    paths["small"].write_text("hello from a tool")
    paths["png"].write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    return paths


def offload(home: Path, *args: str) -> int:
    return main(["offload", "--task", "t1", "--home", str(home), "--sandbox", "none", *args])


def test_offload_prints_each_admitted_text_in_order(
    home: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert offload(home, str(files["small"]), str(files["big"])) == 0
    out = capsys.readouterr().out
    assert out.startswith("hello from a tool\n")
    fields = parse_notice(out[len("hello from a tool\n") :])
    assert fields is not None
    assert fields["tool"] == "list_prs"
    assert fields["call_id"] == "list_prs"
    assert fields["reason"].startswith("per_call")
    assert Path(fields["path"]).name == "list_prs.json"  # its own name, not list_prs.json.json
    assert Path(fields["path"]).read_bytes() == files["big"].read_bytes()


def test_offload_json_has_exactly_the_documented_keys(
    home: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert offload(home, "--json", str(files["big"]), str(files["small"]), str(files["png"])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    big, small, png = (json.loads(line) for line in lines)
    for item in (big, small, png):
        assert list(item) == JSON_KEYS

    data = files["big"].read_bytes()
    assert big["call_id"] == "list_prs" and big["tool"] == "list_prs"
    assert (big["offloaded"], big["reason"], big["tokens_exact"]) == (True, "per_call", False)
    assert big["tokens"] > 6_000
    assert big["bytes"] == len(data)
    assert big["sha256"] == hashlib.sha256(data).hexdigest()
    assert Path(big["path"]).read_bytes() == data
    assert parse_notice(big["text"]) is not None
    assert 0 < big["inline_tokens"] <= 400

    assert small == {
        "call_id": "echo",
        "tool": "echo",
        "offloaded": False,
        "reason": None,
        "tokens": small["tokens"],
        "tokens_exact": True,
        "inline_tokens": small["tokens"],
        "bytes": len("hello from a tool"),
        "sha256": None,
        "path": None,
        "text": "hello from a tool",
    }

    assert (png["offloaded"], png["reason"], png["tokens"], png["tokens_exact"]) == (
        True,
        "binary",
        None,
        None,
    )
    assert Path(png["path"]).read_bytes() == files["png"].read_bytes()


def test_tool_flag_names_every_result(
    home: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert offload(home, "--json", "--tool", "search", str(files["small"])) == 0
    assert json.loads(capsys.readouterr().out)["tool"] == "search"


def test_files_are_one_step_for_the_aggregate(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPILLBOX_AGGREGATE_TOKENS", "1000")
    names = []
    # Room for the notice's recovery hint (a store-only task without tools: issue 25 item 7).
    for i, words in enumerate([250, 700, 500]):
        path = tmp_path / f"r{i}.txt"
        path.write_text("word " * words)
        names.append(str(path))
    assert offload(home, "--json", *names) == 0
    reasons = [json.loads(line)["reason"] for line in capsys.readouterr().out.splitlines()]
    assert reasons == [None, "aggregate", None]  # the largest alone brings it under


def test_a_missing_file_is_one_line_on_stderr(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = offload(home, str(tmp_path / "nope.json"))
    captured = capsys.readouterr()
    assert code != 0
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "nope.json" in captured.err


def test_an_unwritable_home_is_one_line_on_stderr(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    code = offload(blocker / "home", str(files["small"]))
    captured = capsys.readouterr()
    assert code != 0
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert "home" in captured.err


def test_a_missing_task_argument_is_a_usage_error(
    home: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["offload", "--home", str(home), "--sandbox", "none", str(files["small"])])
    assert info.value.code != 0
    assert "--task" in capsys.readouterr().err


# The top level: --version and --help


def exits_with(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What main prints for argv, which exits 0 (as --version and --help do)."""
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    assert info.value.code == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    out = exits_with(capsys, "--version")
    assert out == f"spillbox {importlib.metadata.version('spillbox')}\n"


def test_the_installed_command_prints_the_version_the_package_is_built_with() -> None:
    spillbox = Path(sys.executable).with_name("spillbox")
    done = subprocess.run(
        [str(spillbox), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["dynamic"] == ["version"]
    source = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert source == "spillbox._version.__version__"
    written = (ROOT / "runtime" / "spillbox" / "_version.py").read_text()
    [version] = re.findall(r'^__version__ = "([^"]+)"$', written, re.M)
    assert done.stdout == f"spillbox {version}\n"


def test_version_and_help_load_neither_the_records_nor_the_catalog_nor_docker() -> None:
    """What `spillbox --version` and `--help` load in a fresh process: none of the modules
    that only the commands need (the records, with dataclasses; SQLAlchemy; Docker;
    tiktoken). Their start-up is measured in benchmarks/startup_bench.py."""
    heavy = ("dataclasses", "spillbox.types", "sqlalchemy", "docker", "tiktoken", "duckdb")
    for argv in (["--version"], ["--help"]):
        probe = (
            "import sys\nfrom spillbox.cli import main\n"
            f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            f"print(sorted(name for name in {heavy!r} if name in sys.modules))"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
        )
        assert done.stdout.splitlines()[-1] == "[]", (argv, done.stdout)


def first_try(help_text: str) -> list[list[str]]:
    """The commands the help shows to try, each as its words."""
    return [shlex.split(line) for line in help_text.splitlines() if line.startswith("  spillbox ")]


def offload_as_the_help_shows(
    capsys: pytest.CaptureFixture[str], folder: Path, monkeypatch: pytest.MonkeyPatch, *flags: str
) -> list[str]:
    """Runs the help's first command (with flags) on a large prs.json in folder; returns the
    second command, to run next."""
    offload_, exec_ = first_try(exits_with(capsys, "--help"))
    monkeypatch.chdir(folder)
    (folder / "prs.json").write_text(json.dumps(PR_ROWS))
    assert main([*offload_[1:], *flags]) == 0
    return exec_


def test_help_says_what_spillbox_is_and_shows_a_first_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = exits_with(capsys, "--help")
    usage, about = text.split("\n\n")[:2]
    assert usage.startswith("usage: spillbox")
    assert 2 <= len(about.splitlines()) <= 3
    assert "tool results" in about and "context" in about and "sandbox" in about
    commands = first_try(text)
    assert [argv[:2] for argv in commands] == [["spillbox", "offload"], ["spillbox", "exec"]]
    for argv in commands:  # each is a command line the parser takes as it is
        args = _parser().parse_args(argv[1:])
        assert args.task == "demo"
    assert "--version" in text and "COMMAND" in text


def test_the_first_command_names_the_table_the_second_one_queries(
    capsys: pytest.CaptureFixture[str],
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exec_ = offload_as_the_help_shows(
        capsys, tmp_path, monkeypatch, "--home", str(home), "--sandbox", "none"
    )
    fields = parse_notice(capsys.readouterr().out)
    assert fields is not None, "a large JSON file is offloaded"
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        [row] = harness.catalog.artifacts("demo")
    # A JSON artifact is a table named after its artifact id.
    assert f'FROM "{row.artifact_id}"' in exec_[-1]


@pytest.mark.docker
def test_the_first_commands_run_as_the_help_shows_them(
    capsys: pytest.CaptureFixture[str],
    docker_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exec_ = offload_as_the_help_shows(capsys, tmp_path, monkeypatch, "--home", str(docker_home))
    capsys.readouterr()
    assert main([*exec_[1:], "--home", str(docker_home)]) == 0
    assert capsys.readouterr().out.split() == ["n", str(len(PR_ROWS))]


def test_a_file_keeps_its_name_and_a_task_offloaded_under_the_old_names_still_finds_it(
    home: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from spillbox import Harness, ToolResult

    data = json.dumps(PR_ROWS)  # other bytes than the file's (the same would be one artifact)
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        with harness.task("t1") as task:  # what `spillbox offload` stored before: call id = name
            [old] = task.admit([ToolResult("list_prs.json", "list_prs", data)])
    assert old.artifact is not None and old.artifact.path.endswith("/list_prs.json.json")
    capsys.readouterr()
    assert offload(home, "--json", str(files["big"])) == 0
    new = json.loads(capsys.readouterr().out)
    assert new["call_id"] == "list_prs" and new["path"].endswith("/list_prs.json")
    with Harness(sandbox="none", home=home, gc_interval=-1) as harness:
        task = harness.existing("t1")
        assert [(r.artifact_id, Path(r.path).name) for r in task.artifacts()] == [
            ("list_prs.json", "list_prs.json.json"),
            ("list_prs", "list_prs.json"),
        ]
        # The old artifact is still found by its id and path; the new one by its own.
        assert task.artifact("list_prs.json").artifact_id == "list_prs.json"
        assert task.artifact(old.artifact.path).artifact_id == "list_prs.json"
        assert task.artifact("list_prs").artifact_id == "list_prs"
        assert task.artifact(new["path"]).artifact_id == "list_prs"
