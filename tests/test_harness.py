"""The harness end to end with sandbox="none": the gate, the store and the notice together."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import regex
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spillbox import Admitted, Harness, Policy, SpillboxError, ToolResult, parse_notice
from spillbox.admission import not_text
from spillbox.tokens import TokenCounter, default_counter

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00"
CJK = "人工智能正在改变软件开发的方式。开发者使用大型语言模型编写代码并诊断生产环境中的故障。"
WORDS = "fix the parser bug when large input files are not closed so add tests and docs".split()


def open_harness(home: Path, **kwargs: Any) -> Harness:
    # No environment, no background collector: tests see only what they set.
    return Harness(sandbox="none", home=home, environ={}, gc_interval=-1, **kwargs)


@pytest.fixture
def harness(home: Path) -> Iterator[Harness]:
    with open_harness(home) as h:
        yield h


def pr_json(target_bytes: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    prs: list[dict[str, Any]] = []
    size = 0
    while size < target_bytes:
        pr = {
            "id": len(prs),
            "title": " ".join(rng.choices(WORDS, k=8)),
            "state": rng.choice(["open", "closed"]),
            "body": " ".join(rng.choices(WORDS, k=rng.randint(40, 300))),
        }
        prs.append(pr)
        size += len(json.dumps(pr, indent=2)) + 4
    return json.dumps(prs, indent=2)


class RecordingCounter:
    def __init__(self, inner: TokenCounter) -> None:
        self.name = inner.name
        self.max_token_chars = inner.max_token_chars
        self.inner = inner
        self.lengths: list[int] = []

    def count(self, text: str) -> int:
        self.lengths.append(len(text))
        return self.inner.count(text)


def fields_of(item: Admitted) -> dict[str, str]:
    fields = parse_notice(item.text)
    assert fields is not None, item.text
    return fields


def test_the_api_of_the_issue(harness: Harness) -> None:
    payload = pr_json(200_000)
    with harness.task("t1") as task:
        admitted = task.admit(
            [
                ToolResult(call_id="c1", tool="list_prs", content=payload),
                ToolResult(call_id="c2", tool="echo", content="hi"),
            ]
        )
        big, small = admitted
        assert (small.call_id, small.text, small.offloaded, small.reason) == (
            "c2",
            "hi",
            False,
            None,
        )
        assert small.artifact is None
        assert (small.tokens, small.tokens_exact, small.inline_tokens) == (1, True, 1)

        assert (big.call_id, big.tool, big.offloaded, big.reason) == (
            "c1",
            "list_prs",
            True,
            "per_call",
        )
        assert big.artifact is not None
        assert big.tokens is not None and big.tokens > 6_000
        assert big.tokens_exact is False  # 200 KB: estimated from samples, and labelled so
        assert Path(big.artifact.path).read_bytes() == payload.encode()
        assert big.artifact.sha256 == hashlib.sha256(payload.encode()).hexdigest()
        assert big.artifact.bytes == len(payload.encode())

        fields = fields_of(big)
        assert fields["path"] == big.artifact.path
        assert fields["sha256"] == big.artifact.sha256
        assert fields["bytes"] == str(big.artifact.bytes)
        assert fields["tokens"] == f"~{big.tokens} (estimated)"
        assert fields["shape"].startswith("JSON array of ")
        assert json.loads(fields["keys"]) == ["id", "title", "state", "body"]
        assert big.inline_tokens == default_counter().count(big.text)
        assert big.artifact.path.endswith(".json")
        # The store-only backend runs no code and no tools are registered: the notice names
        # the one route that works there, the CLI on the same store (issue 25 item 7).
        assert fields["hint"] == (
            f"cli: spillbox call --sandbox none --task 't1' read_artifact "
            f'\'{{"artifact_id": "{big.artifact.id}"}}\''
        )


def test_error_flag_is_carried(harness: Harness) -> None:
    with harness.task("t1") as task:
        (item,) = task.admit([ToolResult("c1", "t", "boom", is_error=True)])
    assert item.is_error and not item.offloaded


def test_a_40_mb_result_is_decided_without_counting_it_whole(home: Path) -> None:
    inner = pr_json(1_000_000)[1:-1]
    payload = "[" + ",".join([inner] * 40) + "\n]"
    assert len(payload) > 40_000_000
    counter = RecordingCounter(default_counter())
    with open_harness(home, counter=counter) as harness, harness.task("t1") as task:
        (item,) = task.admit([ToolResult("c1", "list_prs", payload)])
        assert item.reason == "per_call"
        assert item.tokens_exact is False
        assert item.artifact is not None
        assert item.artifact.host_path.stat().st_size == len(payload)
        assert item.artifact.sha256 == hashlib.sha256(payload.encode()).hexdigest()
    assert max(counter.lengths) < 1_000_000
    assert sum(counter.lengths) < len(payload) / 100
    assert counter.inner.count(item.text) <= 400


class Words:
    """A provider's own counter, here: whitespace-separated words."""

    name = "words"
    max_token_chars = 64

    def count(self, text: str) -> int:
        return len(text.split())


def test_a_custom_counter_is_plugged_in(home: Path) -> None:
    policy = Policy(per_call_tokens=10, aggregate_tokens=10_000)
    with open_harness(home, counter=Words(), policy=policy) as harness:
        assert harness.counter.name == "words"
        with harness.task("t1") as task:
            ten, eleven = task.admit(
                [ToolResult("c1", "t", " ".join(["中文"] * 10)), ToolResult("c2", "t", "w " * 11)]
            )
    assert (ten.offloaded, ten.inline_tokens) == (False, 10)
    assert (eleven.reason, eleven.tokens) == ("per_call", 11)
    assert eleven.inline_tokens == Words().count(eleven.text)


@pytest.mark.parametrize(
    ("content", "shape"),
    [
        (PNG + bytes(range(256)) * 4, "binary (image/png)"),
        (b'{"ok": "caf\xe9 is latin-1"}', "binary ("),
        (b"\xff" * 10, "binary ("),
    ],
    ids=["png", "latin1", "ff"],
)
def test_binary_and_invalid_utf8_are_stored_exactly_and_described(
    harness: Harness, content: bytes, shape: str
) -> None:
    with harness.task("t1") as task:
        (item,) = task.admit([ToolResult("c1", "fetch", content)])
        assert item.reason == "binary"
        assert item.tokens is None and item.tokens_exact is None
        assert item.artifact is not None
        assert item.artifact.host_path.read_bytes() == content
        assert item.artifact.path.endswith(".bin")
        fields = fields_of(item)
        assert fields["shape"].startswith(shape)
        assert fields["head_hex"] == content[:16].hex()
        assert fields["tokens"] == "n/a (binary)"


@pytest.mark.parametrize("content", [None, 12345, ["a"], {"rows": 1}])
def test_a_result_that_is_neither_text_nor_bytes_is_refused_in_one_line(content: Any) -> None:
    with pytest.raises(TypeError, match=r"ToolResult\.content must be str or bytes, not ") as e:
        ToolResult(call_id="c1", tool="t", content=content)
    assert "\n" not in str(e.value) and "json.dumps" in str(e.value)


@pytest.mark.parametrize("field", ["call_id", "tool"])
@pytest.mark.parametrize("value", [None, 7, b"c1"])
def test_an_id_or_tool_name_that_is_not_text_is_refused(field: str, value: Any) -> None:
    given = {"call_id": "c1", "tool": "t", field: value}
    with pytest.raises(TypeError, match=rf"ToolResult\.{field} must be a str, not "):
        ToolResult(content="x", **given)


def test_a_bytes_like_result_is_stored_as_the_bytes_it_held(harness: Harness) -> None:
    held = bytes(random.Random(3).randbytes(50_000)) + b"\xff"
    buffer = bytearray(held)
    result = ToolResult(call_id="c1", tool="t", content=buffer)
    buffer[:4] = b"XXXX"  # changed after the result was made: the result keeps what it held
    view = ToolResult(call_id="c2", tool="t", content=memoryview(held))
    task = harness.task("t1")
    admitted = task.admit([result, view])
    for item in admitted:
        assert item.offloaded and item.artifact is not None
        assert item.artifact.host_path.read_bytes() == held
    assert admitted[1].text.count("c1") >= 1  # the same bytes: pointed to the first copy


def test_the_same_step_twice_gives_the_same_texts(harness: Harness) -> None:
    step = [
        ToolResult("c1", "list_prs", pr_json(60_000, seed=1)),
        ToolResult("c2", "list_prs", pr_json(20_000, seed=2)),
        ToolResult("c3", "read", CJK * 120),
        ToolResult("c4", "echo", "small"),
        ToolResult("c5", "fetch", PNG),
    ]
    with harness.task("t1") as task:
        items = task.admit(step)
        assert [item.reason for item in items] == ["per_call", None, "aggregate", None, "binary"]
        first = [item.text for item in items]
        again = [item.text for item in task.admit(step)]
    with harness.task("t2") as other:
        elsewhere = [item.text for item in other.admit(step)]
    assert again == first
    # Another task stores elsewhere: the texts differ only by the task's folder and name.
    moved = [t.replace("/tasks/t2/", "/tasks/t1/") for t in elsewhere]
    assert [t.replace("--task 't2'", "--task 't1'") for t in moved] == first


def test_a_repeated_call_id_with_new_content_gets_a_new_file(harness: Harness) -> None:
    with harness.task("t1") as task:
        (a,) = task.admit([ToolResult("c1", "t", pr_json(60_000, seed=1))])
        (b,) = task.admit([ToolResult("c1", "t", pr_json(60_000, seed=2))])
    assert a.artifact is not None and b.artifact is not None
    assert a.artifact.path != b.artifact.path
    assert a.artifact.host_path.read_bytes() != b.artifact.host_path.read_bytes()


def check_step(items: Sequence[Admitted], results: Sequence[ToolResult], policy: Policy) -> None:
    """The gate's invariants, plus nothing lost and every notice bounded."""
    counter = default_counter()
    assert [item.call_id for item in items] == [r.call_id for r in results]
    eligible: dict[int, int] = {}
    for i, (item, result) in enumerate(zip(items, results, strict=True)):
        data, text = result.payload()
        assert item.inline_tokens == counter.count(item.text)
        if not item.offloaded:
            assert item.text == text
            assert item.inline_tokens <= policy.per_call_tokens
            eligible[i] = item.inline_tokens
            continue
        assert item.artifact is not None
        assert item.artifact.host_path.read_bytes() == data
        assert item.inline_tokens <= policy.notice_max_tokens
        fields = fields_of(item)
        assert fields["sha256"] == hashlib.sha256(data).hexdigest()
        if item.reason == "aggregate":
            assert item.tokens is not None and item.tokens <= policy.per_call_tokens
            eligible[i] = item.tokens
    # Only results larger than any notice can be are worth offloading by the aggregate.
    eligible = {i: n for i, n in eligible.items() if n > policy.notice_max_tokens}
    assert all(item.reason != "aggregate" for i, item in enumerate(items) if i not in eligible)
    order = sorted(eligible, key=lambda i: (results[i].is_error, -eligible[i], i))
    k = sum(1 for i in eligible if items[i].reason == "aggregate")
    assert {i for i in eligible if items[i].reason == "aggregate"} == set(order[:k])
    if k < len(order):
        assert sum(item.inline_tokens for item in items) <= policy.aggregate_tokens


contents = st.one_of(
    st.integers(min_value=0, max_value=400).map(
        lambda n: " ".join(random.Random(n).choices(WORDS, k=n))
    ),
    st.integers(min_value=0, max_value=200).map(lambda n: CJK[: n % len(CJK)] * (1 + n // 20)),
    st.binary(max_size=200),
    st.text(max_size=300),
)


@settings(max_examples=40, deadline=None)
@given(
    step=st.lists(st.tuples(contents, st.booleans()), min_size=1, max_size=6),
    per_call=st.integers(min_value=20, max_value=400),
    aggregate=st.integers(min_value=300, max_value=1_500),
)
def test_any_step_through_the_harness_keeps_the_invariants(
    step: list[tuple[str | bytes, bool]], per_call: int, aggregate: int
) -> None:
    policy = Policy(per_call_tokens=per_call, aggregate_tokens=aggregate)
    results = [
        ToolResult(f"call-{i}", "tool", content, is_error=is_error)
        for i, (content, is_error) in enumerate(step)
    ]
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_harness(Path(tmp), policy=policy) as harness,
        harness.task("t") as task,
    ):
        items = task.admit(results)
        check_step(items, results, policy)


@settings(max_examples=40, deadline=None)
@given(
    call_id=st.one_of(
        st.text(max_size=300),
        st.sampled_from(["..", "../../../etc/passwd", "/abs", "a/b", ".", "x" * 5_000, "😀" * 300]),
    ),
    data=st.binary(min_size=1, max_size=500),
)
@example(call_id="\x00", data=b"\x80")  # refused: a NUL in the id (hypothesis found it once)
@example(call_id="\ud800", data=b"x" * 40)
def test_any_call_id_and_any_bytes_are_stored_inside_the_task(call_id: str, data: bytes) -> None:
    policy = Policy(per_call_tokens=1)
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_harness(Path(tmp), policy=policy) as harness,
        harness.task("t") as task,
    ):
        (item,) = task.admit([ToolResult(call_id, "tool", data)])
        if not_text(call_id) is not None:  # no catalog holds it: one line, nothing stored
            assert (item.reason, item.artifact) == ("refused", None)
            assert item.text.startswith(
                "[spillbox] result refused, nothing was stored: its call id"
            )
            assert "\n" not in item.text and task.artifacts() == []
        elif item.offloaded:
            assert item.artifact is not None
            assert item.artifact.host_path.read_bytes() == data
            offload = task.storage.offload.resolve()
            assert item.artifact.host_path.resolve().parent == offload
            assert item.inline_tokens <= 400
            fields_of(item)
        else:  # a UTF-8 payload of at most one token
            assert default_counter().count(data.decode()) <= 1


def test_notice_fits_for_an_object_with_hundreds_of_long_keys(harness: Harness) -> None:
    obj = {f"field_{i}_" + "very_long_key_name_" * 6: {"v": i} for i in range(600)}
    with harness.task("t1") as task:
        (item,) = task.admit([ToolResult("c1", "t", json.dumps(obj))])
    assert item.reason == "per_call"
    assert item.inline_tokens <= 400
    assert fields_of(item)["shape"] == "JSON object with 600 keys"


@pytest.mark.parametrize(
    "payload",
    [
        json.dumps({"键" * 80 + str(i): "😀中文" * 30 for i in range(300)}, ensure_ascii=False),
        json.dumps(
            [{"名前" * 30 + str(k): "値" for k in range(100)} for _ in range(40)],
            ensure_ascii=False,
        ),
        ("😀👍🏽👨\u200d👩\u200d👧🇯🇵" * 200 + "中文字符" * 300 + "\n") * 10,
        ",".join(f"列{i}" * 20 for i in range(400)) + "\n" + ",".join("1" * 400) + "\n",
    ],
    ids=["cjk-keys", "cjk-array", "emoji-text", "wide-csv"],
)
def test_notice_fits_for_cjk_and_emoji_heavy_payloads(harness: Harness, payload: str) -> None:
    with harness.task("t1") as task:
        (item,) = task.admit([ToolResult("c1", "t", payload)])
    assert item.offloaded
    assert item.inline_tokens <= 400


@settings(max_examples=40, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(["a", " ", "中", "😀", "👍", "🏽", "\u0301", "\u200d", "\n", '"']),
        min_size=201,
        max_size=800,
    )
)
def test_previews_are_whole_characters_at_most_100(text: str) -> None:
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_harness(Path(tmp), policy=Policy(per_call_tokens=1)) as harness,
        harness.task("t") as task,
    ):
        (item,) = task.admit([ToolResult("c1", "t", text)])
    assert item.offloaded
    fields = fields_of(item)
    head, tail = json.loads(fields["head"]), json.loads(fields["tail"])
    assert len(head) <= 100 and len(tail) <= 100
    assert text.startswith(head) and text.endswith(tail)
    # Both cuts fall between grapheme clusters (UAX #29): no accent, skin tone or emoji
    # sequence is split.
    clusters = {m.start() for m in regex.finditer(r"\X", text)} | {len(text)}
    assert len(head) in clusters and len(text) - len(tail) in clusters


def test_an_unwritable_home_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(SpillboxError, match="home|SPILLBOX_HOME|storage"):
        with open_harness(blocker / "home") as harness:
            harness.task("t1")


def test_policy_comes_from_the_environment_mapping(home: Path) -> None:
    environ = {"SPILLBOX_PER_CALL_TOKENS": "5", "SPILLBOX_AGGREGATE_TOKENS": "50"}
    with Harness(sandbox="none", home=home, environ=environ, gc_interval=-1) as harness:
        assert (harness.policy.per_call_tokens, harness.policy.aggregate_tokens) == (5, 50)
        with harness.task("t1") as task:
            (item,) = task.admit([ToolResult("c1", "t", "one two three four five six seven")])
    assert item.reason == "per_call"


def test_tasks_are_listed_and_removed(harness: Harness) -> None:
    with harness.task("t1") as task:
        (item,) = task.admit([ToolResult("c1", "t", b"\xff\xfe")])
    with harness.task("../odd id"):
        pass
    assert sorted(harness.tasks()) == ["../odd id", "t1"]
    harness.remove("t1")
    assert harness.tasks() == ["../odd id"]
    assert item.artifact is not None and not item.artifact.host_path.exists()


def test_a_large_result_given_as_bytes_is_stored_and_told_as_its_str(harness: Harness) -> None:
    """A large ASCII result given as bytes is read as LargeText (never decoded whole): the
    same artifact, decision and notice as the same result given as str."""
    payload = pr_json(3 * 1024 * 1024)
    admitted = {}
    for kind, content in (("str", payload), ("bytes", payload.encode())):
        with harness.task(kind) as task:
            [admitted[kind]] = task.admit([ToolResult("c1", "list_prs", content)])
            assert task.read("c1") == payload.encode()
    as_str, as_bytes = admitted["str"], admitted["bytes"]
    assert as_bytes.offloaded and as_bytes.reason == as_str.reason == "per_call"
    assert (as_bytes.tokens, as_bytes.tokens_exact) == (as_str.tokens, as_str.tokens_exact)
    assert as_bytes.text.replace("bytes", "str") == as_str.text.replace("bytes", "str")


_HOLD = """
import json, sys, tempfile
from pathlib import Path
from spillbox import Harness, ToolResult

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

piece = json.dumps([{"id": i, "title": "a title", "body": "x" * 200} for i in range(100)])
data = ("[" + ",".join([piece[1:-1]] * (int(sys.argv[1]) // len(piece))) + "]").encode()
with tempfile.TemporaryDirectory() as home, Harness(
    sandbox="none", home=Path(home), environ={}, gc_interval=-1
) as harness:
    with harness.task("warm") as task:  # the offload path's first use, not measured
        task.admit([ToolResult("w", "x", json.dumps([{"a": "b" * 100}] * 20000))])
    with harness.task("t") as task:
        before = status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        [admitted] = task.admit([ToolResult("c1", "list", data)])
        peak = status("VmHWM")
print(json.dumps({"growth": (peak - before) / len(data), "offloaded": admitted.offloaded}))
"""


def test_a_large_result_given_as_bytes_is_never_held_twice() -> None:
    """The gate stores a large ASCII result given as bytes without a decoded copy beside
    it: its peak RSS grows by a small part of the payload (a str result takes one copy,
    its encoding)."""
    done = subprocess.run(
        [sys.executable, "-c", _HOLD, str(48 * 1024 * 1024)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    answer = json.loads(done.stdout)
    assert answer["offloaded"] and answer["growth"] < 0.25, answer
