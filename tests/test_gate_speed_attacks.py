"""The gate's fast paths (issue 24 items 3 and 4) keep every guarantee: a result decided
by its length alone, an encoding loaded only when first used, a large JSON object read
from its ends only. Each test would fail if the fast path cut a corner."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spillbox import Harness, ToolResult
from spillbox.cli import main
from spillbox.config import Policy
from spillbox.errors import ConfigError
from spillbox.gate import Offload, admit
from spillbox.tokens import SAMPLE_WINDOW_CHARS, SAMPLE_WINDOWS, default_counter
from spillbox.types import Artifact
from test_tokens import RecordingCounter

BAD_ENCODING = "no_such_base"


def _records(target: int) -> str:
    rows, size = [], 0
    while size < target:
        rows.append({"id": len(rows), "title": "fix the flaky test", "body": "word " * 40})
        size += 260
    return json.dumps(rows)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SPILLBOX_"):
            monkeypatch.delenv(name)


def test_a_megabyte_is_offloaded_without_counting_any_prefix_of_it() -> None:
    # Over limit * max_token_chars characters, the length alone decides: the only counts
    # are the notice's sampled windows, whatever the result's size.
    text = _records(1024 * 1024)
    counter = RecordingCounter(default_counter())
    offloaded: list[Offload] = []

    def offload(request: Offload) -> tuple[Artifact, str, int]:
        offloaded.append(request)
        return Artifact.__new__(Artifact), "notice", 1  # the gate reads none of it

    (decision,) = admit([ToolResult("c1", "t", text)], Policy(), counter, offload)
    assert decision.reason == "per_call" and decision.tokens is not None
    assert not decision.tokens.exact  # the notice's estimate, not a full count
    assert len(counter.lengths) == SAMPLE_WINDOWS
    assert max(counter.lengths) <= SAMPLE_WINDOW_CHARS
    assert [r.data for r in offloaded] == [text.encode()]  # byte for byte


def test_an_encoding_that_cannot_load_fails_the_step_whole_with_nothing_stored(
    tmp_path: Path,
) -> None:
    environ = {"SPILLBOX_ENCODING": BAD_ENCODING}
    with Harness(sandbox="none", home=tmp_path, environ=environ) as harness:
        task = harness.task("t1")  # opening a task does not load the encoding
        step = [
            ToolResult("c1", "pdf", b"\x00\x01binary first"),
            ToolResult("c2", "big", _records(200_000)),
        ]
        with pytest.raises(ConfigError) as raised:
            task.admit(step)
        said = str(raised.value)
        assert "\n" not in said and BAD_ENCODING in said, said
        # The binary result came first, yet nothing was stored: every result is judged
        # before any is offloaded.
        assert harness.catalog.artifacts("t1") == []
        assert list(task.storage.offload.iterdir()) == []
        task.close()


def test_a_command_that_never_counts_never_loads_the_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with Harness(sandbox="none", home=tmp_path, environ={}) as harness, harness.task("T") as task:
        (stored,) = task.admit([ToolResult("c1", "list", _records(200_000))])
        assert stored.offloaded
    monkeypatch.setenv("SPILLBOX_ENCODING", BAD_ENCODING)
    common = ["call", "--home", str(tmp_path), "--sandbox", "none", "--task", "T"]
    assert main([*common, "list_artifacts", "{}"]) == 0
    assert '"c1"' in capsys.readouterr().out
    # Reading a page counts its tokens: there the encoding is loaded, and its error is
    # the tool's one-line answer.
    assert main([*common, "read_artifact", '{"artifact_id": "c1"}']) == 1
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and f"unknown tiktoken encoding {BAD_ENCODING!r}" in out, out
