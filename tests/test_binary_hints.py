"""Which JSON payloads hold long base64 (issue 22 item 3): the profile's long_strings, which
makes the hints cut long strings (tests/sandbox/test_attacks_binary_hints.py runs them)."""

from __future__ import annotations

import base64
import json
import os

import pytest

from api_shapes import github_search, slack_history
from spillbox.profile import BINARY_WINDOW_BYTES, BINARY_WINDOWS, LONG_STRING_CHARS, profile


def long_strings(value: object) -> bool:
    text = json.dumps(value)
    return profile(text.encode(), text).long_strings


def blob(size: int) -> str:
    return base64.b64encode(os.urandom(size)).decode()


@pytest.mark.parametrize(
    "value",
    [
        {"text": "a picture", "resources": [{"resource": {"uri": "file:///a", "blob": blob(900)}}]},
        [{"name": f"f{i}", "data": blob(3000)} for i in range(3)],
        {"image": blob(LONG_STRING_CHARS)},
        {"key": base64.urlsafe_b64encode(os.urandom(400)).decode()},
        {"hex": os.urandom(200).hex()},
    ],
    ids=["mcp-resources", "records", "just-long-enough", "base64url", "hex"],
)
def test_json_with_a_long_base64_or_hex_string_says_so(value: object) -> None:
    assert long_strings(value)


@pytest.mark.parametrize(
    "value",
    [
        github_search(500),
        slack_history(500),
        {"sha": [os.urandom(32).hex() for _ in range(100)]},  # digests: 64 characters each
        {"image": blob(LONG_STRING_CHARS * 3 // 4 - 3)},  # 252 characters
        {"prose": "a long description of what the tool did " * 400},
        [list(range(1000))],
    ],
    ids=["github", "slack", "digests", "just-short", "prose", "numbers"],
)
def test_api_records_prose_and_digests_are_not_long_strings(value: object) -> None:
    assert not long_strings(value)


def test_a_large_payload_is_looked_at_in_windows_that_find_its_blobs() -> None:
    """Past BINARY_WINDOWS windows' worth, the windows find blobs that are a good share of
    the payload's bytes wherever they are: here one in every 200 records, a third of it."""
    records = github_search(20_000)["items"]
    assert len(json.dumps(records)) > 8 * BINARY_WINDOWS * BINARY_WINDOW_BYTES
    assert not long_strings({"items": records})
    for record in records[100::200]:
        record["avatar"] = blob(BINARY_WINDOW_BYTES)
    assert long_strings({"items": records})
