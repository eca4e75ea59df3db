"""`spillbox tools` and `spillbox call`: the model-facing tools on the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spillbox import Harness, ToolResult
from spillbox.cli import main
from spillbox.langs import LANGS
from test_tools import check_definitions


@pytest.fixture(autouse=True)
def no_spillbox_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CLI reads SPILLBOX_* (one place, from_env): tests see only their own flags.
    for name in list(os.environ):
        if name.startswith("SPILLBOX_"):
            monkeypatch.delenv(name)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("fmt", "name_of", "schema_of"),
    [
        ("anthropic", lambda d: d["name"], lambda d: d["input_schema"]),
        ("openai", lambda d: d["function"]["name"], lambda d: d["function"]["parameters"]),
        ("responses", lambda d: d["name"], lambda d: d["parameters"]),
    ],
)
def test_tools_prints_the_definitions(
    capsys: pytest.CaptureFixture[str], fmt: str, name_of: object, schema_of: object
) -> None:
    code, out, _ = run_cli(capsys, "tools", "--format", fmt)
    assert code == 0
    definitions = json.loads(out)
    assert [name_of(d) for d in definitions] == [  # type: ignore[operator]
        "sandbox_exec",
        "read_artifact",
        "list_artifacts",
        "search_artifacts",
    ]
    # Valid as the provider SDK's own type, and strict, as printed.
    assert check_definitions(definitions, fmt) == [name_of(d) for d in definitions]  # type: ignore[operator]
    assert schema_of(definitions[0])["properties"]["lang"]["enum"] == list(LANGS)  # type: ignore[operator]
    code, out, _ = run_cli(capsys, "tools", "--format", fmt, "--sandbox", "none")
    assert [name_of(d) for d in json.loads(out)] == [  # type: ignore[operator]
        "read_artifact",
        "list_artifacts",
        "search_artifacts",
    ]


def test_tools_rejects_an_unknown_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["tools", "--format", "gemini"])
    assert exit_.value.code != 0
    assert "invalid choice" in capsys.readouterr().err


def test_call_prints_what_the_model_would_see(
    capsys: pytest.CaptureFixture[str], home: Path
) -> None:
    common = ["--task", "T", "--home", str(home), "--sandbox", "none"]
    code, out, _ = run_cli(capsys, "call", *common, "list_artifacts", "{}")
    assert code == 0 and json.loads(out) == []

    payload = "\n".join(f"line {i}: " + "word " * 30 for i in range(3_000))
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as harness:
        with harness.task("T") as task:
            task.admit([ToolResult(call_id="c1", tool="logs", content=payload)])

    code, out, _ = run_cli(capsys, "call", *common, "list_artifacts", "{}")
    assert code == 0
    [row] = json.loads(out)
    assert (row["artifact_id"], row["tool"]) == ("c1", "logs")

    code, out, _ = run_cli(capsys, "call", *common, "read_artifact", '{"artifact_id": "c1"}')
    assert code == 0
    page = json.loads(out)
    assert payload.startswith(page["text"]) and page["has_more"] is True
    cursor = json.dumps({"artifact_id": "c1", "cursor": page["next_cursor"]})
    code, out, _ = run_cli(capsys, "call", *common, "read_artifact", cursor)
    assert code == 0
    assert payload.startswith(page["text"] + json.loads(out)["text"])


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("no_such_tool", "{}", "unknown tool 'no_such_tool'"),
        ("sandbox_exec", '{"lang": "sh", "code": "id"}', "unknown tool 'sandbox_exec'"),
        ("list_artifacts", "{not json", "the arguments must be a JSON object, for example {}"),
        ("read_artifact", "notjson", 'for example {"artifact_id": "c1"}'),
        ("read_artifact", '{"artifact_id": "nope"}', "no artifact 'nope'"),
    ],
)
def test_a_failed_call_exits_non_zero(
    capsys: pytest.CaptureFixture[str], home: Path, tool: str, arguments: str, expected: str
) -> None:
    code, out, _ = run_cli(
        capsys, "call", "--task", "T", "--home", str(home), "--sandbox", "none", tool, arguments
    )
    assert code != 0
    assert expected in json.loads(out)["error"]  # the model's view, still JSON


def test_the_installed_command(home: Path) -> None:
    spillbox = Path(sys.executable).with_name("spillbox")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPILLBOX_")}
    done = subprocess.run(
        [str(spillbox), "call", "--task", "T", "--home", str(home), "--sandbox", "none",
         "list_artifacts", "{}"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    bad = subprocess.run(
        [str(spillbox), "call", "--task", "T", "--home", str(home), "--sandbox", "none", "nope"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "unknown tool" in bad.stdout
