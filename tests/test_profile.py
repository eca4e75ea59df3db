"""Profiling: what a payload is, read from a bounded part of it, never crashing."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api_shapes import SHAPES, at_least, github_search, graphql_pull_requests, slack_history
from spillbox.notice import describe
from spillbox.profile import (
    MAX_ARRAYS,
    MAX_KEY_LOOKUPS,
    PROFILE_BUDGET_BYTES,
    SCAN_BUDGET_BYTES,
    SCAN_BUDGET_VALUES,
    TEXT_WINDOW_CHARS,
    _decoded_array,
    _scanned_object,
    _streamed_shape,
    loaded_shape,
    parse_path,
    path_text,
    profile,
)
from spillbox.types import EXTENSIONS, ArrayFacts, LargeText, Shape

PNG_HEADER = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00"


def shape_of(data: bytes) -> Shape:
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return profile(data, text)


def test_json_array_of_objects_lists_keys_first_seen_first() -> None:
    data = json.dumps([{"id": 1, "title": "a"}, {"id": 2, "body": "b"}], indent=2).encode()
    shape = shape_of(data)
    assert shape == Shape(
        kind="json_array",
        count=2,
        count_exact=True,
        element="objects",
        keys=("id", "title", "body"),
    )
    assert shape.extension == "json"
    assert describe(shape) == "JSON array of 2 objects"


@pytest.mark.parametrize(
    ("value", "element"),
    [
        ([1, 2.5, 3], "numbers"),
        (["a", "b"], "strings"),
        ([[1], [2]], "arrays"),
        ([1, "a"], "mixed values"),
    ],
)
def test_json_array_element_kinds(value: list[Any], element: str) -> None:
    shape = shape_of(json.dumps(value).encode())
    assert (shape.kind, shape.count, shape.element) == ("json_array", len(value), element)


def test_empty_json_array() -> None:
    assert describe(shape_of(b"[]")) == "JSON array of 0 elements"


def test_json_object_keys_and_their_types() -> None:
    data = json.dumps({"items": [1], "meta": {"a": 1}, "name": "x", "n": 1, "ok": True, "z": None})
    shape = shape_of(data.encode())
    assert shape.kind == "json_object"
    assert shape.keys == ("items", "meta", "name", "n", "ok", "z")
    assert shape.nested == {
        "items": "array",
        "meta": "object",
        "name": "string",
        "n": "number",
        "ok": "boolean",
        "z": "null",
    }
    assert describe(shape) == "JSON object with 6 keys"


def test_json_object_nested_keys_are_not_top_level_keys() -> None:
    data = json.dumps({"": {"inner": 1}, "a.b": [{"deep": 2}]}).encode()
    shape = shape_of(data)
    assert shape.keys == ("", "a.b")
    assert shape.nested == {"": "object", "a.b": "array"}


@pytest.mark.parametrize("data", [b"false", b"true", b"null", b"-12.5", b'"a string"', b" 42\n"])
def test_json_scalars(data: bytes) -> None:
    assert shape_of(data).kind == "json_scalar"


def test_numbers_beyond_64_bits_are_still_json() -> None:
    data = json.dumps({"id": 2**64, "amount": 1e308, "tiny": 1e-400, "big": [10**30]}).encode()
    data = data.replace(b"1e+308", b"1e400")
    assert shape_of(data).kind == "json_object"
    assert shape_of(b"[18446744073709551616, 1e400]").count == 2


def test_ndjson_records_and_keys() -> None:
    data = b'{"a": 1}\n{"b": 2}\n\n{"a": 3, "c": [1]}\n'
    shape = shape_of(data)
    assert (shape.kind, shape.count, shape.keys) == ("ndjson", 3, ("a", "b", "c"))
    assert shape.extension == "ndjson"
    assert describe(shape) == "NDJSON, 3 records"


def test_csv_columns_and_rows() -> None:
    shape = shape_of(b"id,name,score\n1,ann,3\n2,bob,4\n3,cy,5\n")
    assert (shape.kind, shape.count, shape.keys) == ("csv", 3, ("id", "name", "score"))
    assert describe(shape) == "CSV, 3 rows, 3 columns"


def test_tsv_is_csv_with_tabs() -> None:
    shape = shape_of(b"id\tname\n1\tann\n2\tbob\n")
    assert (shape.kind, shape.keys) == ("csv", ("id", "name"))


def test_text_lines() -> None:
    shape = shape_of("line one\nzweite Zeile\n第三行\nno newline at end".encode())
    assert (shape.kind, shape.count) == ("text", 4)
    assert shape.extension == "txt"
    assert describe(shape) == "text, 4 lines"


def test_empty_payload_is_empty_text() -> None:
    assert describe(shape_of(b"")) == "text, 0 lines"


def test_png_header_is_binary_with_sniffed_type() -> None:
    shape = shape_of(PNG_HEADER + bytes(range(256)))
    assert (shape.kind, shape.mime) == ("binary", "image/png")
    assert shape.extension == "bin"
    assert describe(shape) == "binary (image/png)"


def test_invalid_utf8_without_magic_is_binary() -> None:
    shape = shape_of(b"abc\xff\xfe\xfddef")
    assert shape.kind == "binary"
    assert describe(shape).startswith("binary (")


def test_large_array_count_is_an_estimate_that_says_so() -> None:
    items = [{"id": i, "body": "word " * (i % 50)} for i in range(20_000)]
    data = json.dumps(items, indent=2).encode()
    assert len(data) > 4 * PROFILE_BUDGET_BYTES
    shape = shape_of(data)
    assert shape.kind == "json_array"
    assert not shape.count_exact
    assert shape.count is not None
    assert abs(shape.count - len(items)) <= 0.25 * len(items)
    assert describe(shape).startswith("JSON array of about ")
    assert shape.keys == ("id", "body")
    assert len(str(shape.count).rstrip("0")) <= 2  # no more digits than an estimate has


@pytest.mark.parametrize(
    ("rows", "expected"), [(400, "about 400 "), (1_000, "about 1,000 "), (2_600, "about 2,600 ")]
)
def test_an_estimated_count_is_rounded_to_two_digits(rows: int, expected: str) -> None:
    # Rows of one size: the extrapolation is close, and rounding makes it read exact.
    data = json.dumps([{"id": f"{i:08d}", "body": "x" * 1200} for i in range(rows)]).encode()
    assert len(data) > PROFILE_BUDGET_BYTES
    assert expected in describe(shape_of(data))


def test_a_large_object_within_the_scan_budget_has_every_key_named() -> None:
    data = json.dumps({f"key{i}": list(range(5)) for i in range(20_000)}).encode()
    assert PROFILE_BUDGET_BYTES < len(data) <= SCAN_BUDGET_BYTES
    shape = shape_of(data)
    assert shape.keys == tuple(f"key{i}" for i in range(20_000)) and shape.count_exact
    assert describe(shape) == "JSON object with 20000 keys"
    # Values are looked at for the first keys only: simdjson finds a key by walking.
    assert len(shape.nested) == MAX_KEY_LOOKUPS and len(shape.arrays) == MAX_ARRAYS
    # Read from its two ends only (beyond the scan budget), it says keys may be missing.
    streamed = _streamed_shape(data)
    assert streamed is not None and 0 < len(streamed.keys) < 20_000
    assert describe(streamed).endswith("+ keys")


def test_an_object_of_more_values_than_the_scan_budget_is_streamed() -> None:
    # Small records: few bytes, many values, which simdjson's time follows.
    value = {"data": [{"id": i, "name": f"n{i}"} for i in range(300_000)], "next": None}
    data = json.dumps(value).encode()
    assert len(data) <= SCAN_BUDGET_BYTES and data.count(b",") > SCAN_BUDGET_VALUES
    shape = shape_of(data)
    assert shape.keys == ("data", "next")
    records = shape.records
    assert records is not None and not records.count_exact and records.count is not None
    assert abs(records.count - 300_000) <= 0.2 * 300_000


def test_two_large_arrays_are_each_counted_exactly() -> None:
    value = {
        "a": [{"id": i, "name": f"n{i}"} for i in range(30_000)],
        "b": [{"id": i, "name": f"n{i}"} for i in range(30_000)],
    }
    data = json.dumps(value).encode()
    assert len(data) > 4 * PROFILE_BUDGET_BYTES
    shape = shape_of(data)
    assert (shape.keys, shape.count_exact) == (("a", "b"), True)
    assert shape.arrays == (
        ArrayFacts(("a",), 30_000, True, "objects"),
        ArrayFacts(("b",), 30_000, True, "objects"),
    )


def test_keys_between_the_head_and_the_tail_are_named_with_their_arrays() -> None:
    value = {
        "first": [{"id": i} for i in range(40_000)],
        "middle": {"total": 3, "pages": {"nodes": ["p"] * 20_000}},
        "ok": True,
        "second": ["word"] * 40_000,
        "more": None,
    }
    data = json.dumps(value).encode()
    middle = data.index(b'"middle"')
    assert PROFILE_BUDGET_BYTES < middle < len(data) - 64 * 1024
    shape = shape_of(data)
    assert shape.keys == tuple(value) and shape.count_exact
    assert describe(shape) == "JSON object with 5 keys"
    assert shape.nested == {
        "first": "array", "middle": "object", "ok": "boolean", "second": "array", "more": "null"
    }  # fmt: skip
    assert shape.arrays == (
        ArrayFacts(("first",), 40_000, True, "objects"),
        ArrayFacts(("middle", "pages", "nodes"), 20_000, True, "strings"),
        ArrayFacts(("second",), 40_000, True, "strings"),
    )


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("second", ["alike", "different"])
def test_beyond_the_scan_budget_two_arrays_and_the_keys_between_are_found(
    indent: int | None, second: str
) -> None:
    # Read from its ends (as beyond the scan budget), the tail jumps over the second
    # array to where it opens, names it and the keys before it, then reaches the first.
    records: Any = [{"id": i, "name": f"n{i}"} for i in range(30_000)]
    if second == "different":
        records = [{"ts": f"{i}.0001", "text": "deploy finished"} for i in range(30_000)]
    value = {
        "a": [{"id": i, "name": f"n{i}"} for i in range(30_000)],
        "total": 60_000,
        "page": {"next": "p2", "size": 2},
        "b": records,
        "next": "x",
    }
    shape = _streamed_shape(json.dumps(value, indent=indent).encode())
    assert shape is not None
    assert (shape.keys, shape.count_exact) == (tuple(value), True)
    assert describe(shape) == "JSON object with 5 keys"
    assert [(f.path, f.count_exact, f.element) for f in shape.arrays] == [
        (("a",), False, "objects"),
        (("b",), False, "objects"),
    ]
    for facts in shape.arrays:
        assert facts.count is not None and abs(facts.count - 30_000) <= 0.1 * 30_000, facts


def test_beyond_the_scan_budget_an_array_that_cannot_be_jumped_over_has_no_count() -> None:
    # Strings give no element to search for: the array open at the tail may be another
    # than the head's, so the head's gets no count and the keys say some may be missing.
    value = {"a": ["word"] * 200_000, "mid": 1, "b": ["other"] * 200_000}
    shape = _streamed_shape(json.dumps(value).encode())
    assert shape is not None and not shape.count_exact
    assert shape.keys == ("a",)
    assert shape.arrays == (ArrayFacts(("a",), None, False, "strings"),)
    assert describe(shape) == "JSON object with 1+ keys"


@pytest.mark.parametrize(
    "tail", [', "id": 18446744073709551616}', ', "bad": "\\ud800"}'], ids=["bigint", "surrogate"]
)
def test_an_object_simdjson_refuses_is_streamed_instead(tail: str) -> None:
    text = json.dumps({"items": [{"id": i} for i in range(40_000)]})[:-1] + tail
    json.loads(text)  # valid JSON, which simdjson does not take
    shape = shape_of(text.encode())
    assert shape.kind == "json_object" and shape.keys[0] == "items" and len(shape.keys) == 2
    assert shape.records is not None and not shape.records.count_exact  # streamed


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 50_000,  # unterminated and deep: a path per event would be quadratic
        b"[" * 50_000 + b"]" * 50_000,
        b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
        b'{"a":' * 60_000 + b"1" + b"}" * 60_000,  # over the budget, too deep for simdjson
        b'{"a": 1}\n' + b"[" * 5_000 + b"\n",  # NDJSON-like, too deep for json.loads
        b"a" * 200_000 + b"\nsecond line\n",  # a line over csv's field size limit
        b'"' + b"a" * 200_000 + b"\nb,c\n",
    ],
    ids=[
        "deep-open",
        "deep-valid",
        "deep-object",
        "deep-scanned",
        "deep-ndjson",
        "long-line",
        "long-quoted",
    ],  # fmt: skip
)
def test_pathological_payloads_are_described_not_crashed_on(data: bytes) -> None:
    shape = shape_of(data)
    assert shape.extension in EXTENSIONS.values()
    assert describe(shape)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(value=st.lists(json_values, max_size=8), indent=st.sampled_from([None, 2]))
def test_any_small_json_array_is_counted_exactly(value: list[Any], indent: int | None) -> None:
    shape = shape_of(json.dumps(value, indent=indent, ensure_ascii=False).encode())
    assert (shape.kind, shape.count, shape.count_exact) == ("json_array", len(value), True)


@settings(max_examples=150, deadline=None)
@given(value=st.dictionaries(st.text(max_size=10), json_values, max_size=8))
def test_any_small_json_object_lists_its_keys_in_order(value: dict[str, Any]) -> None:
    shape = shape_of(json.dumps(value, ensure_ascii=False).encode())
    assert shape.kind == "json_object"
    assert shape.keys == tuple(value)
    assert set(shape.nested) == set(value)


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=400),
        st.text(max_size=400).map(lambda s: s.encode("utf-8", "surrogatepass")),
        st.lists(st.sampled_from(["[", "]", "{", "}", '"a":', "1", ",", "\n", " ", '"'])).map(
            lambda parts: "".join(parts).encode()
        ),
    )
)
def test_profile_never_raises_and_binary_means_not_utf8(data: bytes) -> None:
    shape = shape_of(data)
    assert shape.extension in EXTENSIONS.values()
    assert describe(shape)
    try:
        data.decode("utf-8")
        utf8 = True
    except UnicodeDecodeError:
        utf8 = False
    assert (shape.kind == "binary") == (not utf8)


@settings(max_examples=150, deadline=None)
@given(
    value=st.one_of(
        st.lists(json_values, max_size=8),
        st.dictionaries(st.text(max_size=10), json_values, max_size=8),
    ),
    indent=st.sampled_from([None, 2]),
)
def test_the_whole_parse_and_the_stream_describe_alike(value: Any, indent: int | None) -> None:
    # Small payloads take the C parser, large ones the streaming one: same shape.
    data = json.dumps(value, indent=indent).encode()
    assert loaded_shape(json.loads(data)) == _streamed_shape(data)


@settings(max_examples=150, deadline=None)
@given(value=st.dictionaries(st.text(max_size=10), json_values, max_size=8))
def test_the_scan_describes_an_object_as_the_whole_parse_does(value: dict[str, Any]) -> None:
    data = json.dumps(value, ensure_ascii=False).encode()
    scanned = _scanned_object(data)
    if scanned is None:  # refused: a NUL in a string, or an integer beyond 64 bits
        assert b"\\u0000" in data or re.search(rb"\d{19}", data)
    else:
        assert scanned == loaded_shape(json.loads(data))


# Records wrapped in an object: API responses


def test_github_search_names_every_key_and_its_records() -> None:
    shape = shape_of(json.dumps(github_search(30)).encode())
    assert shape.keys == ("total_count", "incomplete_results", "items")
    assert shape.count_exact
    assert shape.arrays == (ArrayFacts(("items",), 30, True, "objects"),)
    assert shape.records == ArrayFacts(("items",), 30, True, "objects")


def test_slack_history_names_the_keys_after_its_messages() -> None:
    shape = shape_of(json.dumps(slack_history(50), indent=2).encode())
    assert shape.keys == tuple(slack_history(1))
    assert shape.records is not None and shape.records.path == ("messages",)
    assert (shape.records.count, shape.records.count_exact) == (50, True)


def test_a_graphql_connection_is_found_four_keys_deep() -> None:
    value = graphql_pull_requests(40)
    value["data"]["repository"]["labels"] = {"nodes": ["bug", "docs"]}  # not records
    shape = shape_of(json.dumps(value).encode())
    assert shape.keys == ("data",)
    assert [facts.path for facts in shape.arrays] == [
        ("data", "repository", "pullRequests", "nodes"),
        ("data", "repository", "labels", "nodes"),
    ]
    assert shape.records == ArrayFacts(
        ("data", "repository", "pullRequests", "nodes"), 40, True, "objects"
    )


def test_arrays_deeper_than_four_keys_or_inside_arrays_are_not_records() -> None:
    value = {"a": {"b": {"c": {"d": {"e": [{"x": 1}]}}}}, "list": [{"inner": [{"y": 1}]}]}
    shape = shape_of(json.dumps(value).encode())
    assert shape.arrays == (ArrayFacts(("list",), 1, True, "objects"),)
    assert shape.records is not None and shape.records.path == ("list",)


def test_the_largest_array_of_objects_is_the_records() -> None:
    value = {"warnings": [{"w": 1}], "tags": ["a"] * 50, "data": [{"id": i} for i in range(9)]}
    shape = shape_of(json.dumps(value).encode())
    assert shape.records is not None and shape.records.path == ("data",)
    assert [(f.path, f.element) for f in shape.arrays][1] == (("tags",), "strings")


def test_the_issue_example_names_the_key_after_a_long_array_and_counts_it() -> None:
    # 50,000 small records, then a 3 MB string: both keys named, the count exact; read
    # from its ends only (beyond the scan budget), the count is an estimate.
    value = {"data": [{"id": i, "name": f"n{i}"} for i in range(50_000)], "blob": "z " * 1_500_000}
    data = json.dumps(value).encode()
    shape = shape_of(data)
    assert (shape.keys, shape.count_exact) == (("data", "blob"), True)
    assert shape.nested == {"data": "array", "blob": "string"}
    assert shape.records == ArrayFacts(("data",), 50_000, True, "objects")
    streamed = _streamed_shape(data)
    assert streamed is not None and streamed.keys == ("data", "blob")
    records = streamed.records
    assert records is not None and records.path == ("data",) and not records.count_exact
    assert records.count is not None and abs(records.count - 50_000) <= 0.25 * 50_000


@pytest.mark.parametrize("name", list(SHAPES))
def test_over_40_mb_every_key_is_named_and_the_count_is_an_estimate(name: str) -> None:
    builder, path, _ = SHAPES[name]
    text, count = at_least(builder, 40 * 1024 * 1024)
    assert len(text) > SCAN_BUDGET_BYTES
    shape = shape_of(text.encode())
    # Beyond the scan budget: the tail jumps over the records to where they open, in
    # the part the head read, so no key can lie unread between.
    assert shape.keys == tuple(builder(1)) and shape.count_exact
    records = shape.records
    assert records is not None and records.path == path
    assert not records.count_exact and records.count is not None
    assert abs(records.count - count) <= 0.1 * count, (records.count, count)
    assert len(str(records.count).rstrip("0")) <= 2


def test_a_string_value_full_of_escaped_quotes_does_not_confuse_the_tail() -> None:
    value = {"items": [{"q": 'say "hi"\\'} for _ in range(30_000)], "next": '\\"}]{["'}
    shape = _streamed_shape(json.dumps(value).encode())
    assert shape is not None
    assert shape.keys == ("items", "next")
    assert shape.nested["next"] == "string"


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.text(max_size=6), min_size=1, max_size=4))
def test_a_records_path_reads_back_as_written(keys: list[str]) -> None:
    path = tuple(keys)
    assert parse_path(path_text(path)) == path
    assert "\n" not in path_text(path)


@pytest.mark.parametrize(
    ("text", "path"),
    [("items", ("items",)), ("$.data.search.nodes", ("data", "search", "nodes")),
     ('.["a.b"].c', ("a.b", "c")), ("$", ()), ("", ())],
)  # fmt: skip
def test_records_paths_as_a_model_writes_them(text: str, path: tuple[str, ...]) -> None:
    assert parse_path(text) == path


@pytest.mark.parametrize("text", ["a..b", "a b", "items[0]", "a.", '["unclosed'])
def test_a_malformed_records_path_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a path"):
        parse_path(text)


def test_a_long_string_of_escaped_json_after_the_records_is_skipped_and_named() -> None:
    inner = json.dumps([{"say": 'a "quoted" \\ word'} for _ in range(40_000)])
    value = {"items": [{"id": i} for i in range(40_000)], "raw": inner, "next": None}
    shape = _streamed_shape(json.dumps(value).encode())
    assert shape is not None
    assert shape.keys == ("items", "raw", "next")
    assert shape.nested == {"items": "array", "raw": "string", "next": "null"}
    records = shape.records
    assert records is not None and records.count is not None
    assert abs(records.count - 40_000) <= 0.1 * 40_000


record_shapes = st.lists(
    st.sampled_from(["id", "ts", "name", "type", "labels", "text"]),
    min_size=1,
    max_size=3,
    unique=True,
)
members = st.one_of(
    st.tuples(st.just("records"), record_shapes, st.integers(0, 12_000) | st.just(12_000)),
    st.tuples(st.just("strings"), st.just(["s"]), st.integers(0, 30_000)),
    st.tuples(st.just("small"), st.just([]), st.integers(0, 3)),
)


@settings(max_examples=40, deadline=None)
@given(layout=st.lists(members, min_size=1, max_size=5), indent=st.sampled_from([None, 1]))
def test_read_from_its_ends_an_object_says_only_what_is_so(
    layout: list[tuple[str, list[str], int]], indent: int | None
) -> None:
    # Whatever its arrays and keys, the stream's account of a large object is true:
    # keys said complete are all the keys, every key it names is one, and a counted
    # array's length is close.
    value: dict[str, Any] = {}
    for index, (kind, keys, size) in enumerate(layout):
        name = f"k{index}"
        if kind == "records":
            value[name] = [{key: f"{key}-{i}" for key in keys} for i in range(size)]
        elif kind == "strings":
            value[name] = [f"s{i}" for i in range(size)]
        else:
            value[name] = {"n": size}
    data = json.dumps(value, indent=indent).encode()
    shape = _streamed_shape(data)
    assert shape is not None
    assert set(shape.keys) <= set(value)
    if shape.count_exact:
        assert shape.keys == tuple(value)
    for facts in shape.arrays:
        actual = len(value[facts.path[0]])
        if facts.count_exact:
            assert facts.count == actual
        elif facts.count is not None:
            assert abs(facts.count - actual) <= 0.2 * actual + 10, (facts, actual)


def test_an_array_of_objects_read_whole_from_the_end_is_counted_once_per_element() -> None:
    # Each object element was counted where it ended and again where it opened: 6 for 3.
    value = {"items": [{"id": i} for i in range(40_000)], "warnings": [{"code": 1}] * 3}
    shape = _streamed_shape(json.dumps(value).encode())
    assert shape is not None
    assert shape.arrays[-1] == ArrayFacts(("warnings",), 3, True, "objects")


# Arrays longer than the budget: their elements decoded one by one, up to the budget


def long_array(element: Any, pad: int = 0) -> str:
    """A JSON array of element repeated past the budget, after a string of pad characters
    (which moves where the budget cuts)."""
    one = json.dumps(element)
    repeats = PROFILE_BUDGET_BYTES // (len(one) + 2) + 50
    return "[" + json.dumps("p" * pad) + (", " + one) * repeats + "]"


ELEMENTS_TO_CUT = [
    {"id": 123456789, "title": 'a title with "quotes" and \\u00e9 \u00e9', "ok": False},
    "a long string " * 40,
    -12345.678e-3,
    False,
    None,
    [1, [2, [3, "three"]], {"k": True}],
    "\u00e9\u4e2d\U0001f600",
]


@settings(max_examples=200, deadline=None)
@given(element=st.sampled_from(ELEMENTS_TO_CUT), pad=st.integers(0, 700))
def test_an_array_cut_anywhere_by_the_budget_is_decoded_as_the_stream_describes_it(
    element: Any, pad: int
) -> None:
    text = long_array(element, pad)
    decoded, streamed = _decoded_array(text), _streamed_shape(text.encode())
    assert decoded is not None and streamed is not None
    assert replace(decoded, count=None) == replace(streamed, count=None)
    assert not decoded.count_exact
    total = len(json.loads(text))
    assert decoded.count is not None and abs(decoded.count - total) <= 0.05 * total


@pytest.mark.parametrize("indent", [None, 2])
def test_api_records_past_the_budget_are_counted_within_five_percent(indent: int | None) -> None:
    items = [{"id": i, "body": "word " * (i % 50), "labels": [{"n": i}]} for i in range(20_000)]
    data = json.dumps(items, indent=indent).encode()
    shape = shape_of(data)
    assert (shape.kind, shape.element, shape.keys) == (
        "json_array",
        "objects",
        ("id", "body", "labels"),
    )
    assert shape.count is not None and abs(shape.count - len(items)) <= 0.05 * len(items)


@pytest.mark.parametrize(
    "text",
    [
        "[" + "1, " * 80_000 + "x, " + "2, " * 20_000 + "3]",  # not JSON inside the head
        "[" + "1, " * 80_000 + "NaN, " + "2, " * 20_000 + "3]",
        "[" + "1, " * 80_000 + "2 3, " + "4, " * 20_000 + "5]",  # no comma between two
        "[1, 2] [" + "3, " * 90_000 + "4]",  # two arrays
        "[" + '"' + "s" * 300_000 + '", 1]',  # a first element longer than the head
        "[1, " + "[" * 200_000 + "]" * 200_000 + "]",  # nesting too deep for the C parser
        "\f[" + "1, " * 90_000 + "2]",  # space JSON does not allow
    ],
    ids=["not-json", "nan", "no-comma", "two-arrays", "long-first", "deep", "form-feed"],
)
def test_what_the_c_parser_cannot_judge_goes_to_the_stream(text: str) -> None:
    assert _decoded_array(text) is None
    streamed = _streamed_shape(text.encode())
    shape = shape_of(text.encode())
    assert (shape.kind == "json_array") == (streamed is not None)
    if streamed is not None:
        assert replace(shape, long_strings=False) == streamed


def test_an_array_that_ends_in_the_head_is_counted_exactly_past_trailing_space() -> None:
    text = "[1, 2, 3]" + " \n" * PROFILE_BUDGET_BYTES
    assert shape_of(text.encode()) == Shape(kind="json_array", count=3, element="numbers")


def test_lines_of_arrays_past_the_budget_are_ndjson() -> None:
    text = "".join(json.dumps([i, "row " * 10]) + "\n" for i in range(8_000))
    assert len(text) > PROFILE_BUDGET_BYTES
    shape = shape_of(text.encode())
    assert shape.kind == "ndjson"


@cache
def _large_text_cases() -> dict[str, bytes]:
    """ASCII payloads of every kind, some longer than a window of the windowed reads."""
    window = TEXT_WINDOW_CHARS
    records = [{"id": i, "name": f"n{i}", "tags": ["a", "b"]} for i in range(40)]
    ndjson_lines = [json.dumps(r) for r in records * 800]  # about 1.6 MB, lines across windows
    cases = {
        name: at_least(builder, window + 1000)[0].encode()
        for name, (builder, _, _) in SHAPES.items()
    }
    cases |= {
        "array": json.dumps(records).encode(),
        "array, pretty, big": json.dumps(records * 700, indent=2).encode(),
        "array then more": (json.dumps(records) + "\n" + json.dumps(records)).encode(),
        "array then space past a window": (json.dumps(records) + " " * (window + 7)).encode(),
        "array then a word past a window": (json.dumps(records) + " " * window + "x").encode(),
        "object": json.dumps({"total": 3, "items": records}).encode(),
        "space past a window, then an array": (" " * (window + 3) + json.dumps(records)).encode(),
        "ndjson, LF": "\n".join(ndjson_lines).encode(),
        "ndjson, CRLF and blank lines": "\r\n\r\n".join(ndjson_lines).encode() + b"\r\n",
        "ndjson, VT, FF and separators": "\v\f\x1c".join(ndjson_lines[:50]).encode(),
        "csv": ("id,name\n" + "".join(f"{i},n{i}\n" for i in range(100_000))).encode(),
        "text": ("a log line\n\n  \t\n" * 90_000).encode(),
        "scalar string": json.dumps("x" * (window + 10)).encode(),
        "scalar number": b"  -12.5e3",
        "scalar numbers": b"-Infinity 1e400 0123 12. -0 \v5 nulls NaN".replace(b" ", b"|"),
        "a log from a digit": b"2024-12-05 10:00:00 started\n" * 50_000,
        "literal": b"\n false",
        "not json": b"[1, 2,, 3]" * 10,
        "empty": b"",
        "space only": b" \n" * (window // 2 + 5),
    }
    return cases


@pytest.mark.parametrize("name", list(_large_text_cases()))
def test_a_large_text_is_profiled_as_the_str_it_is(name: str) -> None:
    """A large ASCII payload given as bytes is read as LargeText, a window at a time, never
    decoded whole: its shape is the one its str gives."""
    data = _large_text_cases()[name]
    assert data.isascii()
    assert profile(data, LargeText(data)) == profile(data, data.decode())
    for scalar in data.split(b"|") if name == "scalar numbers" else ():
        assert profile(scalar, LargeText(scalar)) == profile(scalar, scalar.decode()), scalar


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(
            ["[", "]", "{", "}", '"a":', "1", "0", "-", "e", ".", "true", "null", "Infinity"]
            + [",", "\n", "\r", "\v", " ", '"', "x"]
        )
    ).map("".join)
)
def test_any_ascii_text_is_profiled_alike_as_large_text(text: str) -> None:
    data = text.encode()
    assert profile(data, LargeText(data)) == profile(data, text)
