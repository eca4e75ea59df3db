"""Attacks on redaction (issue 21, item 4): secrets a JSON encoder hid behind escapes, JSON
nested in strings, results that are not text, and the streams beside stdout. Each test
failed before the fix it names; a redacted JSON document must still parse, at every level."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import test_redaction
from redaction_corpus import anthropic_key, aws_id, github_pat, slack_bot
from spillbox import ExecError, Harness, Retention, ToolResult, codemode
from spillbox.notice import parse_notice
from spillbox.redaction import (
    MAX_NESTING,
    NESTED_KIND,
    _apply,
    _Span,
    _unescape,
    redact_payload,
)
from spillbox.types import ExecRequest, RawExec

harness = test_redaction.harness
"""A harness without a sandbox: what reaches the model, and what is stored."""


def _escape_one(text: str, char: str) -> str:
    """text with the first `char` written as \\u00XX, as a JSON encoder may."""
    return text.replace(char, f"\\u{ord(char):04x}", 1)


def _redacted_json(raw: str) -> tuple[object, dict[str, int]]:
    """The redacted document, parsed (it must parse), and the replacements by kind."""
    result = redact_payload(raw.encode())
    return json.loads(result.data), dict(result.counts)


def _levels(value: object) -> Iterator[object]:
    """value and each JSON document in a string in it, decoded: every level must parse."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from _levels(item)
    elif isinstance(value, list):
        for item in value:
            yield from _levels(item)
    elif isinstance(value, str) and value.startswith("{"):
        yield from _levels(json.loads(value))


# Escapes: redaction reads what a JSON parser reads


def test_a_token_with_one_escaped_letter_is_replaced_whole() -> None:
    for secret in (github_pat, aws_id, slack_bot, anthropic_key):
        letter = next(c for c in secret[6:] if c.isalpha())
        raw = '{"note": "deploy with ' + _escape_one(secret, letter) + ' today"}'
        assert secret in json.loads(raw)["note"]  # what a parser reads: the whole secret
        doc, counts = _redacted_json(raw)
        assert isinstance(doc, dict)
        assert doc["note"].startswith("deploy with [REDACTED:") and doc["note"].endswith(" today")
        assert sum(counts.values()) == 1, (secret, counts)


def test_a_secret_named_key_spelled_with_escapes_has_its_value_replaced() -> None:
    raw = '{"pass\\u0077ord": "hunter2", "api\\u005fkey": 12345, "\\u0074oken": {"v": "x"}}'
    doc, counts = _redacted_json(raw)
    assert doc == {
        "password": "[REDACTED:password]",
        "api_key": "[REDACTED:api_key]",
        "token": "[REDACTED:token]",
    }
    assert counts == {"password": 1, "api_key": 1, "token": 1}


def test_go_and_gson_escaped_query_strings_lose_their_tokens() -> None:
    """Go's encoder writes & as \\u0026, Gson also = as \\u003d; PHP writes / as \\/."""
    raw = json.dumps(
        {
            "go": "https://api.test/cb?state=1&access_token=Zx81kQ0pLmN3vB7c&x=2",
            "gson": "https://api.test/cb?state=1&refresh_token=Qw9eRt5yUi3oPa1s",
            "php": "postgres://app:Pr0dPassw0rd!@db.test:5432/main",
        }
    )
    raw = raw.replace("&", "\\u0026").replace("/", "\\/")
    raw = raw.replace("refresh_token=", "refresh_token\\u003d")
    doc, counts = _redacted_json(raw)
    assert isinstance(doc, dict)
    assert doc["go"] == "https://api.test/cb?state=1&access_token=[REDACTED:token]&x=2"
    assert doc["gson"] == "https://api.test/cb?state=1&refresh_token=[REDACTED:token]"
    assert doc["php"] == "postgres://app:[REDACTED:url_password]@db.test:5432/main"
    assert counts == {"token": 2, "url_password": 1}


def test_a_secret_after_an_escaped_line_break_is_found() -> None:
    """In the escaped bytes `\\nAKIA...` has no word boundary before the key."""
    doc, counts = _redacted_json(json.dumps({"log": f"boot\n{aws_id}\tloaded"}))
    assert doc == {"log": "boot\n[REDACTED:aws_access_token]\tloaded"}
    assert counts == {"aws_access_token": 1}


def test_a_replacement_takes_whole_escapes_only() -> None:
    """A secret whose last letters are escaped, and one right before an escaped quote:
    the escapes around and inside go with it or stay whole, never half."""
    tail = github_pat[:-1] + f"\\u{ord(github_pat[-1]):04x}"
    raw = '{"a": "' + tail + '\\u00e9", "b": "say \\"' + slack_bot + '\\" twice"}'
    doc, _ = _redacted_json(raw)
    assert doc == {"a": "[REDACTED:github_pat]é", "b": 'say "[REDACTED:slack_bot_token]" twice'}


@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_secret_is_replaced_exactly_whatever_escapes_surround_it(ascii_only: bool) -> None:
    """Spans carried back from the decoded text land on the secret's own bytes, both
    where every escape is two bytes for one and where some are \\uXXXX or a pair."""
    around = ["\n", "\\", '"', "é", "😀", "\\u0041", '\t"\\']
    around += ["\ud800"] if ascii_only else []  # a lone surrogate: only as an escape
    for before in around:
        for after in around:
            text = f"{before}x {before}{github_pat} {after}y{after}"
            raw = json.dumps({"v": [text, text]}, ensure_ascii=ascii_only)
            doc, counts = _redacted_json(raw)
            expected = text.replace(github_pat, "[REDACTED:github_pat]")
            assert doc == {"v": [expected, expected]}, (before, after)
            assert counts == {"github_pat": 2}


def test_a_string_is_bounded_right_past_escaped_backslashes_and_many_quotes() -> None:
    """A string ending in an escaped backslash ends at the quote after it; a secret after
    ten thousand escaped quotes is in the string those quotes are in."""
    doc = {
        "a": "C:\\temp\\",
        "b": ' "x"' * 10_000 + f" key={github_pat}",
        "c": f"{github_pat}\\",
        "d": "\\",
    }
    out, counts = _redacted_json(json.dumps(doc))
    assert out == {
        **doc,
        "b": ' "x"' * 10_000 + " key=[REDACTED:github_pat]",
        "c": "[REDACTED:github_pat]\\",
    }
    assert counts == {"github_pat": 2}


def test_the_decoded_text_is_what_a_json_parser_reads() -> None:
    """The decoder that carries spans back agrees with json.loads, escape by escape."""
    for content in (
        r"plain",
        r"a\u0041\/b\\\"c\n\t\b\f\r",
        r"pair \ud83d\ude00 lone \ud800 \udc00 end",
        r"\\u0041 is not an escape",
        r"\u00e9\u20ac\u0000",
    ):
        expected = json.loads('"' + content + '"').encode("utf-8", "surrogatepass")
        assert _unescape(content.encode()) == expected, content


# Nested JSON


def test_json_nested_three_levels_deep_is_redacted_and_every_level_still_parses() -> None:
    inner: object = {"token": "deep-s3cret-value", "db_password": 4711, "id": 7}
    for _ in range(3):
        inner = {"wrapped": json.dumps(inner), "auth": f"Bearer {github_pat}"}
    doc, counts = _redacted_json(json.dumps(inner))
    levels = list(_levels(doc))
    deepest = next(level for level in levels if isinstance(level, dict) and "id" in level)
    assert deepest == {
        "token": "[REDACTED:token]",
        "db_password": "[REDACTED:password]",  # a number became a string, escaped 3 times
        "id": 7,
    }
    assert counts["token"] == 1 and counts["password"] == 1
    assert "deep-s3cret" not in json.dumps(levels) and github_pat not in json.dumps(levels)


def test_nesting_past_the_bound_is_replaced_not_passed_unread() -> None:
    inner: object = {"token": "too-deep-s3cret", "id": 1}
    for _ in range(MAX_NESTING + 1):
        inner = {"w": json.dumps(inner)}
    result = redact_payload(json.dumps(inner).encode())
    assert b"too-deep-s3cret" not in result.data
    assert result.counts.get(NESTED_KIND) == 1
    assert list(_levels(json.loads(result.data)))  # still parses, level by level


def test_nesting_within_the_bound_is_read_to_its_bottom() -> None:
    inner: object = {"token": "bottom-s3cret", "id": 1}
    for _ in range(MAX_NESTING):
        inner = {"w": json.dumps(inner)}
    result = redact_payload(json.dumps(inner).encode())
    assert b"bottom-s3cret" not in result.data
    assert dict(result.counts) == {"token": 1}


def test_overlapping_finds_leave_no_tail_of_a_secret() -> None:
    data = b"x" * 40
    out, counts = _apply(data, [_Span(5, 15, "a"), _Span(10, 30, "b")])
    assert out == b"x" * 5 + b"[REDACTED:a]" + b"x" * 10
    assert counts == {"a": 1}


# Results that are not text


def test_a_nul_byte_does_not_stop_redaction_nor_show_the_secret_in_head_hex(
    harness: Harness,
) -> None:
    task = harness.task("t1", retention=Retention(redact=True))
    content = f"{github_pat} is the key\x00" + "padding line\n" * 100
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=content)])
    assert admitted.offloaded and admitted.artifact is not None
    stored = admitted.artifact.host_path.read_bytes()
    assert github_pat.encode() not in stored and stored.startswith(b"[REDACTED:github_pat]")
    fields = parse_notice(admitted.text)
    assert fields is not None
    assert fields["redactions"] == "1"
    assert fields["head_hex"] == stored[:16].hex()
    assert github_pat.encode()[:16].hex() not in admitted.text


def test_bytes_that_are_not_utf8_are_scanned_as_bytes(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(redact=True))
    content = b"\xff\xfe binary header " + f"password={github_pat}".encode() + b"\x00" * 64
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=content)])
    assert admitted.artifact is not None
    stored = admitted.artifact.host_path.read_bytes()
    assert github_pat.encode() not in stored
    assert stored.startswith(b"\xff\xfe binary header password=[REDACTED:")
    assert stored.endswith(b"\x00" * 64)  # all else byte for byte
    entry = [e for e in harness.catalog.audit("t1") if e.action == "redact"][-1]
    assert json.loads(entry.detail)["replaced"] == 1


# Streams beside stdout


def _raw(stderr: bytes) -> codemode.RawExecFn:
    return lambda request: RawExec(1, b"", stderr, False, False)


def test_stderr_reaches_the_model_redacted_under_a_redacting_policy(harness: Harness) -> None:
    error = f"Conversion Error: Could not convert string '{github_pat}' to INT32\n"
    redacting = harness.task("t1", retention=Retention(redact=True))
    result = codemode.run(redacting, _raw(error.encode()), "sql", "SELECT 1", 5.0)
    expected = "Conversion Error: Could not convert string '[REDACTED:github_pat]' to INT32\n"
    assert result.stderr == expected
    plain = harness.task("t2")
    assert codemode.run(plain, _raw(error.encode()), "sql", "SELECT 1", 5.0).stderr == error


def test_notes_on_output_files_reach_the_model_redacted(harness: Harness) -> None:
    """A script names its output files: a note quotes the name it chose."""
    note = f"export-{github_pat}.csv: not taken: over the size limit"
    task = harness.task("t1", retention=Retention(redact=True))
    raw = RawExec(0, b"", b"", False, False, file_notes=(note,))
    result = codemode.run(task, lambda request: raw, "sh", "true", 5.0)
    assert result.file_notes == (note.replace(github_pat, "[REDACTED:github_pat]"),)


def test_a_long_stderr_is_redacted_before_it_is_cut_to_its_ends(harness: Harness) -> None:
    """A secret across the cut would reach the model as two pieces no rule knows."""
    cut = codemode.STDERR_HEAD_CHARS
    error = "x" * (cut - 10) + f" token={github_pat} " + "y" * 10_000
    task = harness.task("t1", retention=Retention(redact=True))
    stderr = codemode.run(task, _raw(error.encode()), "python", "1", 5.0).stderr
    assert github_pat[:10] not in stderr and github_pat[-10:] not in stderr


def test_an_engine_error_message_reaches_the_model_redacted(harness: Harness) -> None:
    def failing(request: ExecRequest) -> RawExec:
        raise ExecError(f"the SQL engine stopped: bad value {github_pat}", retryable=True)

    task = harness.task("t1", retention=Retention(redact=True))
    with pytest.raises(ExecError) as raised:
        codemode.run(task, failing, "sql", "SELECT 1", 5.0)
    assert github_pat not in str(raised.value) and "[REDACTED:github_pat]" in str(raised.value)
    assert raised.value.retryable and raised.value.__cause__ is None
