"""Paging and cursors on their own: page() and CursorSigner, without a harness."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import string
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api_shapes import graphql_pull_requests
from spillbox.errors import ConfigError
from spillbox.paging import (
    CURSOR_VERSION,
    PAGE_SHARE,
    SECRET_FILE,
    CursorError,
    CursorSigner,
    Page,
    page,
    records_path,
)
from spillbox.tokens import TokenCounter, default_counter

COUNTER = default_counter("cl100k_base")


class RecordingCounter:
    """Counts with tiktoken and remembers how many characters it was asked to count."""

    def __init__(self, inner: TokenCounter) -> None:
        self.name = inner.name
        self.max_token_chars = inner.max_token_chars
        self.inner = inner
        self.chars = 0

    def count(self, text: str) -> int:
        self.chars += len(text)
        return self.inner.count(text)


def all_pages(data: bytes, kind: str, limit: int, counter: TokenCounter = COUNTER) -> list[Page]:
    digest = hashlib.sha256(data).hexdigest()
    pages: list[Page] = []
    start = (0, 0)
    while True:
        current = page(data, digest, kind, start, counter, limit)
        assert current.start == start
        pages.append(current)
        if not current.has_more:
            return pages
        assert current.end > start, "a page must make progress"
        start = current.end


def shown_tokens(current: Page) -> int:
    """The tokens of a page's content as read_artifact's JSON shows it."""
    shown = current.items if current.items is not None else current.text
    return COUNTER.count(json.dumps(shown, ensure_ascii=False))


def budget(limit: int) -> int:
    return max(int(limit * PAGE_SHARE), 16)


# Pages


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=0, max_size=3_000), st.integers(min_value=20, max_value=400))
def test_text_pages_reproduce_any_text_within_budget(text: str, limit: int) -> None:
    data = text.encode("utf-8", "surrogatepass")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return  # not text: bytes pages, tested below
    pages = all_pages(data, "text", limit)
    assert "".join(p.text or "" for p in pages) == text
    for current in pages:
        # The content's own tokens; +2 for the quotes around a JSON string.
        assert shown_tokens(current) <= budget(limit) + 2


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=200),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner),
            max_leaves=20,
        ),
        max_size=40,
    ),
    st.integers(min_value=20, max_value=300),
)
def test_record_pages_reproduce_any_array_within_budget(records: list[Any], limit: int) -> None:
    data = json.dumps(records).encode()
    pages = all_pages(data, "json_array", limit)
    rebuilt: list[Any] = []
    partial = ""
    for current in pages:
        if current.partial:
            partial += current.text or ""
            if current.end[1] == 0:  # the last slice of a record too big for a page
                rebuilt.append(json.loads(partial))
                partial = ""
        else:
            rebuilt.extend(current.items or [])
        # A page of records counts each record +1 (separators tokenise differently
        # once joined); a slice is counted as shown.
        assert shown_tokens(current) <= budget(limit) + len(current.items or []) + 2
    assert rebuilt == records and partial == ""


def test_ndjson_skips_blank_lines_and_text_that_is_not_records_pages_as_lines() -> None:
    pages = all_pages(b'{"a": 1}\n\n  \n{"a": 2}\n', "ndjson", 6_000)
    assert [p.items for p in pages] == [[{"a": 1}, {"a": 2}]]
    broken = b'{"a": 1}\nnot json\n'
    [only] = all_pages(broken, "ndjson", 6_000)
    assert only.unit == "lines" and only.text == broken.decode()
    [obj] = all_pages(b'{"not": "an array"}', "json_array", 6_000)
    assert obj.unit == "lines" and obj.text == '{"not": "an array"}'


def test_empty_payloads_are_one_empty_last_page() -> None:
    [text] = all_pages(b"", "text", 100)
    assert (text.text, text.total, text.has_more) == ("", 0, False)
    [array] = all_pages(b"[]", "json_array", 100)
    assert (array.items, array.total, array.has_more) == ([], 0, False)


def test_bytes_pages_reproduce_the_bytes_within_budget() -> None:
    data = bytes(range(256)) * 300 + b"\xff\xfe"
    pages = all_pages(data, "text", 1_000)
    assert {p.unit for p in pages} == {"bytes"}
    assert b"".join(base64.b64decode(p.text or "") for p in pages) == data
    assert max(COUNTER.count(p.text or "") for p in pages) <= budget(1_000)


def test_a_slice_is_close_to_the_budget_not_a_fraction_of_it() -> None:
    # Pages that use only part of the budget mean more round trips for the model.
    line = ("word " * 200_000).encode()
    pages = all_pages(line, "text", 6_000)
    inner = pages[:-1]
    assert all(p.partial for p in pages)
    assert min(shown_tokens(p) for p in inner) >= 0.9 * budget(6_000)


def test_escaping_is_counted_where_it_costs_more() -> None:
    # Quotes, backslashes and control characters are longer escaped than raw.
    for text in ('"' * 40_000, "\\" * 40_000, "\x01\x02" * 20_000, ("a\t\n" * 20_000)):
        for current in all_pages(text.encode(), "text", 1_000):
            assert shown_tokens(current) <= budget(1_000) + 2


def test_a_huge_line_costs_counting_in_proportion_to_the_page() -> None:
    line = ('{"k": "' + "v" * 10_000_000 + '"}').encode()
    digest = hashlib.sha256(line).hexdigest()
    for kind in ("text", "json_array"):
        counter = RecordingCounter(COUNTER)
        first = page(line, digest, kind, (0, 0), counter, 6_000)
        assert first.partial and first.end[1] > 0
        second = page(line, digest, kind, first.end, counter, 6_000)
        assert second.start == first.end
        # Bounded by the page (a few hundred thousand characters), never the 10 MB line.
        assert counter.chars < 2_000_000, counter.chars


def test_pages_are_the_same_every_time() -> None:
    data = "\n".join(f"line {i} " + "x" * (i % 300) for i in range(3_000)).encode()
    assert all_pages(data, "text", 500) == all_pages(data, "text", 500)


# Cursors


def test_a_cursor_round_trips_and_is_opaque(tmp_path: Path) -> None:
    signer = CursorSigner(tmp_path)
    fields = {"task": "t", "artifact": "a", "sha": "0" * 16, "pos": [3, 7]}
    cursor = signer.sign({**fields, "exp": time.time() + 60})
    assert "." in cursor and all(c.isalnum() or c in "-_." for c in cursor)
    checked = signer.check(cursor, {"task": "t", "artifact": "a"})
    assert checked["pos"] == [3, 7] and checked["v"] == CURSOR_VERSION


def test_every_one_character_edit_of_a_cursor_is_refused(tmp_path: Path) -> None:
    # Base64 decoding ignores spare bits and stray characters: an edited cursor must
    # not be accepted because it happens to decode to the signed bytes.
    signer = CursorSigner(tmp_path)
    cursor = signer.sign({"task": "t", "pos": [12, 0], "exp": time.time() + 60})
    alphabet = string.ascii_letters + string.digits + "-_=+/ \n"
    for i in range(len(cursor) + 1):
        for ch in alphabet:
            for edited in (cursor[:i] + ch + cursor[i + 1 :], cursor[:i] + ch + cursor[i:]):
                if edited != cursor:
                    with pytest.raises(CursorError):
                        signer.check(edited, {})


def test_another_version_is_refused(tmp_path: Path) -> None:
    signer = CursorSigner(tmp_path)
    future = signer.sign({"v": CURSOR_VERSION + 1, "exp": time.time() + 60})
    with pytest.raises(CursorError, match=f"version {CURSOR_VERSION + 1} is not supported"):
        signer.check(future, {})


def test_expiry_and_expectations_are_checked(tmp_path: Path) -> None:
    signer = CursorSigner(tmp_path)
    with pytest.raises(CursorError, match="expired"):
        signer.check(signer.sign({"exp": time.time() - 1}), {})
    cursor = signer.sign({"task": "t", "exp": time.time() + 60})
    with pytest.raises(CursorError, match=r"another task \('t', not 'u'\)"):
        signer.check(cursor, {"task": "u"})


def test_the_secret_is_made_once_private_and_shared(tmp_path: Path) -> None:
    home = tmp_path / "home"
    signers: list[CursorSigner] = []
    ready = threading.Barrier(8, timeout=10)

    def make() -> None:
        ready.wait()  # all at once: the first use of a home is a race
        signers.append(CursorSigner(home))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(signers) == 8
    secret = home / SECRET_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert [p.name for p in home.iterdir()] == [SECRET_FILE]  # no temp file left behind
    cursor = signers[0].sign({"exp": time.time() + 60})
    for signer in signers:
        signer.check(cursor, {})  # every signer of the home accepts it
    with pytest.raises(CursorError, match="another spillbox home"):
        CursorSigner(tmp_path / "other").check(cursor, {})


# Records wrapped in an object


def wrapped_pages(value: Any, limit: int, path: tuple[str, ...] | None = None) -> list[Page]:
    data = json.dumps(value).encode()
    digest = hashlib.sha256(data).hexdigest()
    walked = records_path(data, digest, "json_object", path)
    pages: list[Page] = []
    start = None
    while True:
        current = page(data, digest, "json_object", start, COUNTER, limit, walked)
        pages.append(current)
        if not current.has_more:
            return pages
        assert start is None or current.end > start
        start = current.end


def test_wrapped_records_page_as_records_after_their_envelope() -> None:
    value = graphql_pull_requests(300)
    pages = wrapped_pages(value, 800)
    path = ("data", "repository", "pullRequests", "nodes")
    first, *rest = pages
    assert first.unit == "envelope" and first.records == path and not first.partial
    connection = first.envelope["data"]["repository"]["pullRequests"]
    assert connection["pageInfo"] == value["data"]["repository"]["pullRequests"]["pageInfo"]
    assert connection["nodes"].startswith("[300 records at data.repository.pullRequests.nodes")
    assert len(rest) > 3 and {p.unit for p in rest} == {"records"}
    assert all(p.records == path and p.total == 300 for p in pages)
    assert [item for p in rest for item in p.items or []] == value["data"]["repository"][
        "pullRequests"
    ]["nodes"]
    assert all(shown_tokens(p) <= budget(800) for p in pages)


def test_another_array_is_paged_when_named() -> None:
    value = {"items": [{"id": i} for i in range(50)], "errors": [{"code": 1}, {"code": 2}]}
    data = json.dumps(value).encode()
    digest = hashlib.sha256(data).hexdigest()
    assert records_path(data, digest, "json_object", None) == ("items",)
    pages = wrapped_pages(value, 2_000, ("errors",))
    assert pages[0].envelope == {
        "items": value["items"],
        "errors": "[2 records at errors: on the pages after this one]",
    }
    assert pages[1].items == value["errors"]


def test_a_records_path_that_is_not_an_array_says_which_are() -> None:
    data = json.dumps({"items": [1], "meta": {"next": "x"}}).encode()
    digest = hashlib.sha256(data).hexdigest()
    for asked in [("meta",), ("missing",), ("meta", "next")]:
        with pytest.raises(ConfigError, match="its arrays are items"):
            records_path(data, digest, "json_object", asked)
    with pytest.raises(ConfigError, match="not one"):
        records_path(b"[1]", "d", "json_array", ("items",))
    assert records_path(b"[1]", "d", "json_array", ()) is None


def test_an_object_without_records_still_pages_as_lines() -> None:
    data = json.dumps({"a": 1, "b": ["x", "y"]}).encode()
    digest = hashlib.sha256(data).hexdigest()
    assert records_path(data, digest, "json_object", None) is None
    assert page(data, digest, "json_object", None, COUNTER, 500).unit == "lines"


def test_an_envelope_too_big_for_a_page_is_sliced() -> None:
    value = {"data": [{"id": i} for i in range(20)], "blob": "ab " * 20_000}
    pages = wrapped_pages(value, 1_000)
    envelope = [p for p in pages if p.unit == "envelope"]
    assert len(envelope) > 3 and all(p.partial and p.envelope is None for p in envelope)
    assert json.loads("".join(p.text or "" for p in envelope))["blob"] == value["blob"]
    assert [item for p in pages if p.unit == "records" for item in p.items or []] == value["data"]


def test_the_envelope_page_holds_no_records_and_the_records_start_at_zero() -> None:
    value = {"total_count": 40, "items": [{"id": i} for i in range(40)], "next": "p2"}
    first, second, *_ = wrapped_pages(value, 2_000)
    assert first.unit == "envelope" and (first.start, first.end) == ((0, 0), (0, 0))
    assert first.total == 40 and first.has_more
    assert second.unit == "records" and second.start == (0, 0)
    assert second.items == value["items"] and (second.end, second.has_more) == ((40, 0), False)


def test_a_sliced_envelope_is_positioned_in_its_characters_then_the_records_follow() -> None:
    # The envelope and the first record are each too big for a page: every page starts
    # where the one before ended, and the pages joined give both back.
    value = {"blob": "ab " * 20_000, "data": [{"text": "cd " * 20_000}, {"id": 1}, {"id": 2}]}
    pages = wrapped_pages(value, 1_000)
    envelope = [p for p in pages if p.unit == "envelope"]
    length = len("".join(p.text or "" for p in envelope))
    assert envelope[0].start == (0, 0) and envelope[-1].end == (0, length)
    assert all(p.start[0] == 0 and p.end[0] == 0 for p in envelope)
    for before, after in zip(pages, pages[1:], strict=False):
        assert after.start == before.end
    records = [p for p in pages if p.unit == "records"]
    first_record = "".join(p.text or "" for p in records if p.partial)
    assert json.loads(first_record) == value["data"][0]
    assert records[0].start == (0, length) and records[-1].items == value["data"][1:]


# Text pages that keep units whole, whatever the text


FRAGMENTS = [
    "# Heading\n",
    "## Sub heading\n",
    "```\n",
    "\n",
    "plain words of a paragraph\n",
    "def f(x):\n",
    "    return x\n",
    "@decorator\n",
    "}\n",
    "2026-12-01 09:00:00,001 ERROR failed\n",
    "Traceback (most recent call last):\n",
    '  File "a.py", line 3, in f\n',
    'id,"note with ""quotes"" and\n',
    'a line break",3\n',
    "x" * 300 + "\n",
    "no newline",
    "\r\n",
]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from(FRAGMENTS), min_size=0, max_size=300),
    st.sampled_from(["c1.txt", "notes.md", "mod.py", "app.log", "export.csv"]),
    st.integers(min_value=20, max_value=400),
    st.none() | st.integers(min_value=1, max_value=50),
)
def test_text_pages_of_every_layout_rejoin_and_stay_within_budget(
    parts: list[str], name: str, limit: int, units: int | None
) -> None:
    text = "".join(parts)
    data = text.encode()
    kind = "csv" if name.endswith(".csv") else "text"
    digest = hashlib.sha256(data).hexdigest()
    pages: list[Page] = []
    start = (0, 0)
    while True:
        current = page(data, digest, kind, start, COUNTER, limit, units=units, name=name)
        assert current.start == start
        pages.append(current)
        if not current.has_more:
            break
        assert current.end > start, "a page must make progress"
        if units is not None and not current.partial:
            assert current.returned <= units
        start = current.end
    rejoined = ""
    for current in pages:
        lines = (current.text or "").splitlines(keepends=True)
        rejoined += "".join(lines[current.header :])
        assert shown_tokens(current) <= budget(limit) + 2
    assert rejoined == text
