"""Token counting: real tiktoken tokens, offline, and a threshold decision bounded by the
threshold rather than by the payload."""

from __future__ import annotations

import gzip
import json
import math
import random
import socket
from pathlib import Path

import pytest
import tiktoken.registry
from hypothesis import given, settings
from hypothesis import strategies as st

from spillbox import Harness, ToolResult, tokens
from spillbox.errors import ConfigError
from spillbox.tokens import (
    EXACT_TOTAL_CHARS,
    ScaledCounter,
    TiktokenCounter,
    TokenCount,
    TokenCounter,
    count_within,
    counter_for_model,
    default_counter,
    total,
)

CJK_SAMPLE = (
    "人工智能正在改变软件开发的方式。开发者使用大型语言模型编写代码、审查合并请求并诊断"
    "生产环境中的故障。然而，工具返回的结果往往非常庞大，例如一次查询可能返回数千条记录，"
    "这会迅速耗尽模型的上下文窗口。"
)

WORDS = (
    "the fix for a bug in the parser when handling large input files that were not "
    "closed properly so we add tests docs and a regression check for the release"
).split()


class RecordingCounter:
    """Wraps a counter and remembers the length of every text it was asked to count."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_token_chars = inner.max_token_chars
        self.lengths: list[int] = []

    def count(self, text: str) -> int:
        self.lengths.append(len(text))
        return self.inner.count(text)


def pr_json(target_bytes: int, seed: int = 0) -> str:
    """A pretty-printed JSON array of PR-like objects with long bodies, about target_bytes."""
    rng = random.Random(seed)
    prs = []
    size = 0
    while size < target_bytes:
        i = len(prs)
        pr = {
            "id": 1_000_000 + i,
            "number": i + 1,
            "title": " ".join(rng.choices(WORDS, k=rng.randint(4, 10))).capitalize(),
            "state": rng.choice(["open", "closed", "merged"]),
            "user": {"login": f"dev{rng.randint(1, 300)}", "id": rng.randint(1, 10**6)},
            "labels": [{"name": rng.choice(["bug", "docs", "perf", "ci"])}],
            "created_at": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T10:00:00Z",
            "body": " ".join(rng.choices(WORDS, k=rng.randint(40, 400))),
        }
        prs.append(pr)
        size += len(json.dumps(pr, indent=2)) + 4
    return json.dumps(prs, indent=2)


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return default_counter()


def test_counts_real_cl100k_tokens(counter: TiktokenCounter) -> None:
    assert counter.name == "cl100k_base"
    assert counter.count("hello world") == 2
    assert counter.count("") == 0
    assert isinstance(counter, TokenCounter)
    assert default_counter() is counter


def test_cjk_is_counted_as_real_tokens_not_chars_over_4(counter: TiktokenCounter) -> None:
    chars_over_4 = len(CJK_SAMPLE) / 4
    assert counter.count(CJK_SAMPLE) >= 2 * chars_over_4


def test_token_count_labels_estimates() -> None:
    assert TokenCount(1234, exact=True).label() == "1234"
    assert TokenCount(1234, exact=False).label() == "~1234 (estimated)"


def test_count_within_is_exact_under_the_limit(counter: TiktokenCounter) -> None:
    text = "hello world " * 100
    exact = counter.count(text)
    assert count_within(counter, text, exact) == (True, exact)
    assert count_within(counter, text, exact + 1000) == (True, exact)
    assert count_within(counter, text, exact - 1)[0] is False


def test_count_within_a_word_cut_does_not_call_a_text_at_the_limit_over_it(
    counter: TiktokenCounter,
) -> None:
    # A prefix cut inside a word can count more than the whole word ("internationa" is 3
    # tokens, "internationalization" 2): a text exactly at the limit must not look over it.
    text = "\n" * 10 + "  " + "\n" * 10 + "responsibilitiesresponsibilities responsibilities"
    exact = counter.count(text)
    first_prefix = 8 * exact
    assert len(text) > first_prefix
    assert counter.count(text[:first_prefix]) > exact  # the trap is real
    assert count_within(counter, text, exact) == (True, exact)


@settings(max_examples=150, deadline=None)
@given(
    words=st.lists(
        st.sampled_from(WORDS + ["internationalization", "中文字符", "😀", "x" * 30, "123456"]),
        max_size=120,
    ),
    separators=st.sampled_from([" ", "  ", "\n", " \n "]),
    limit=st.integers(min_value=1, max_value=80),
)
def test_count_within_matches_the_exact_count(
    words: list[str], separators: str, limit: int
) -> None:
    counter = default_counter()
    text = separators.join(words)
    exact = counter.count(text)
    within, counted = count_within(counter, text, limit)
    assert within == (exact <= limit)
    assert counted in (exact, None)


def test_count_within_decides_40_mb_by_its_length_alone(counter: TiktokenCounter) -> None:
    # Over limit * max_token_chars characters, a text is over the limit whatever it holds.
    payload = pr_json(1_000_000) * 40
    recording = RecordingCounter(counter)
    assert count_within(recording, payload, 6_000) == (False, None)
    assert recording.lengths == []


def test_count_within_counts_only_a_bounded_prefix_below_the_cap(counter: TiktokenCounter) -> None:
    cap = 6_000 * counter.max_token_chars + 1
    payload = (pr_json(1_000_000) * 2)[: cap - 1]
    recording = RecordingCounter(counter)
    assert count_within(recording, payload, 6_000) == (False, None)
    assert 0 < max(recording.lengths) <= cap
    assert sum(recording.lengths) < len(payload) / 10


@pytest.mark.parametrize("char", [" ", "a", "中"])
def test_count_within_stays_bounded_on_degenerate_text(counter: TiktokenCounter, char: str) -> None:
    # One repeated character: no word boundaries, and for spaces 128 characters a token.
    payload = char * 2_000_000
    recording = RecordingCounter(counter)
    assert count_within(recording, payload, 6_000) == (False, None)
    assert sum(recording.lengths) <= 2 * (6_000 * counter.max_token_chars + 1)


def test_total_is_exact_for_short_text(counter: TiktokenCounter) -> None:
    text = pr_json(EXACT_TOTAL_CHARS // 2)
    assert total(counter, text) == TokenCount(counter.count(text), exact=True)


def test_total_estimate_is_within_3_percent_on_realistic_json(counter: TiktokenCounter) -> None:
    text = pr_json(3_000_000, seed=7)
    recording = RecordingCounter(counter)
    estimate = total(recording, text)
    exact = counter.count(text)
    assert not estimate.exact
    assert abs(estimate.tokens - exact) <= 0.03 * exact
    assert max(recording.lengths) <= 4_096


def test_total_estimate_on_cjk_text_is_close(counter: TiktokenCounter) -> None:
    text = (CJK_SAMPLE + "\n") * 2_000
    estimate = total(counter, text)
    assert not estimate.exact
    assert abs(estimate.tokens - counter.count(text)) <= 0.03 * counter.count(text)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Any attempt to open a connection is recorded and refused."""
    attempts: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        attempts.append(args)
        raise OSError("network disabled in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def test_missing_encoding_is_a_config_error_without_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[object]
) -> None:
    empty = tmp_path / "tiktoken-cache"
    empty.mkdir()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(empty))
    # tiktoken keeps loaded encodings in a registry; make sure this one is really loaded.
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "p50k_base", raising=False)
    counter = TiktokenCounter("p50k_base")  # loaded when first used, not here
    with pytest.raises(ConfigError, match="TIKTOKEN_CACHE_DIR"):
        counter.count("hello")
    assert no_network == []
    assert list(empty.iterdir()) == []


def test_unknown_encoding_is_a_config_error(no_network: list[object]) -> None:
    counter = TiktokenCounter("no_such_base")
    with pytest.raises(ConfigError, match="unknown tiktoken encoding"):
        counter.count("hello")
    assert no_network == []


def test_default_encoding_loads_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[object]
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    for name in list(tiktoken.registry.ENCODINGS):
        if name.startswith("cl100k_base"):
            monkeypatch.delitem(tiktoken.registry.ENCODINGS, name)
    assert TiktokenCounter("cl100k_base").count("hello world") == 2
    assert no_network == []


def test_o200k_base_loads_offline_from_its_package_and_is_sha256_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[object]
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # no cache: the bundled file is read
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "o200k_base", raising=False)
    counter = TiktokenCounter("o200k_base")
    # o200k_base's own ids for these words (cl100k_base gives [15339, 1917])
    assert counter._encoding.encode_ordinary("hello world") == [24912, 2375]
    assert no_network == []


def test_a_corrupted_o200k_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[object]
) -> None:
    package, path, sha256 = tokens._BUNDLED_FILES["o200k_base.tiktoken"]
    corrupted = gzip.compress(tokens._bundled_file("o200k_base.tiktoken").replace(b"IQ==", b"Ig=="))
    copy = tmp_path / "fake_package"
    (copy / "data").mkdir(parents=True)
    (copy / "__init__.py").write_text("")
    (copy / "data" / "o200k_base.tiktoken.gz").write_bytes(corrupted)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        tokens._BUNDLED_FILES, "o200k_base.tiktoken", ("fake_package", path, sha256)
    )
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    monkeypatch.delitem(tiktoken.registry.ENCODINGS, "o200k_base", raising=False)
    counter = TiktokenCounter("o200k_base")
    with pytest.raises(ConfigError, match="sha256"):
        assert counter.max_token_chars
    assert no_network == []


@pytest.mark.parametrize(
    ("model", "name"),
    [
        ("gpt-5.4", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("o3", "o200k_base"),
        ("gpt-6-astra", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("claude-sonnet-4-6", "cl100k_basex1.57"),
        ("claude-haiku-4-5-20251001", "cl100k_basex1.57"),
        ("claude-opus-4-7", "cl100k_basex2.08"),
        ("claude-sonnet-5", "cl100k_basex2.08"),
    ],
)
def test_each_model_counts_in_its_own_tokens(model: str, name: str) -> None:
    assert counter_for_model(model).name == name


def test_a_claude_factor_scales_cl100k_counts_and_is_configurable() -> None:
    text = "The build failed in step seven because the cache key changed. " * 20
    base = default_counter("cl100k_base").count(text)
    assert counter_for_model("claude-sonnet-4-6").count(text) == math.ceil(base * 1.57)
    mine = counter_for_model("claude-sonnet-4-6", {"claude-sonnet-*": 1.2})
    assert mine.count(text) == math.ceil(base * 1.2)
    with pytest.raises(ConfigError, match="no Claude token factor"):
        counter_for_model("claude-opus-4-6", {"claude-sonnet-*": 1.2})
    with pytest.raises(ConfigError, match="factor must be 1.0 or more"):
        ScaledCounter(default_counter(), 0.5)


def test_an_unknown_model_asks_for_a_counter() -> None:
    with pytest.raises(ConfigError, match="pass a counter"):
        counter_for_model("llama-3-70b")


def test_the_gate_told_the_model_counts_in_its_tokens(tmp_path: Path) -> None:
    text = "The build failed in step seven because the cache key changed. " * 380
    cl100k = default_counter("cl100k_base").count(text)
    assert 4_000 < cl100k < 6_000 < math.ceil(cl100k * 1.57)  # inline in cl100k, not in Claude's
    results = [ToolResult("c1", "logs", text)]
    for counter, offloaded in ((None, False), (counter_for_model("claude-sonnet-4-6"), True)):
        home = tmp_path / str(offloaded)
        with Harness(sandbox="none", home=home, environ={}, gc_interval=-1, counter=counter) as h:
            with h.task("t") as task:
                [admitted] = task.admit(results)
                assert admitted.offloaded is offloaded
