"""Redaction: structure kept (JSON, NDJSON, CSV stay valid), each replacement names its
kind, nothing unredacted reaches the notice, and the access log records what was done."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from redaction_corpus import (
    aws_id,
    aws_secret,
    github_pat,
    jwt1,
    openai_key,
    rsa_pem,
    slack_bot,
    stripe_live,
)
from spillbox import Harness, Retention, ToolResult
from spillbox.digest import PARALLEL_HASH_BYTES
from spillbox.redaction import Redaction, go_regex, kinds, redact, redact_payload
from spillbox.tools import Toolset


@pytest.fixture
def harness(home: Path) -> Iterator[Harness]:
    with Harness(sandbox="none", home=home, environ={}, gc_interval=-1) as h:
        yield h


DB_URL = "postgres://admin:S3cr3tPass@db.internal:5432/prod"


def _ten_secrets(i: int) -> dict[str, object]:
    """One record of the issue's test: ten common secrets, each in its own field."""
    return {
        "id": i,
        "aws_access_key_id": aws_id,
        "secret_access_key": aws_secret,
        "github": github_pat,
        "slack": slack_bot,
        "openai": openai_key,
        "session": jwt1,
        "tls_key": rsa_pem,
        "password": f"pw-{i}-hunter2",
        "billing": stripe_live,
        "dsn": DB_URL,
    }


SECRET_VALUES = [aws_id, aws_secret, github_pat, slack_bot, openai_key, jwt1, stripe_live]


def test_secret_named_json_values_are_replaced_whatever_their_format() -> None:
    doc = {
        "user": "ann",
        "DB_Password": "hunter2",
        "api-key": 123456,
        "clientSecret": {"value": "x", "rotated": ["2026-01-01"]},
        "tokens": [1, 2],
        "auth": {"refresh_token": ["a", "b"], "private_key": None, "has_password": True},
        "usage": {"total_tokens": 812, "token_type": "Bearer"},
    }
    clean, n = redact(json.dumps(doc))
    assert json.loads(clean) == {
        "user": "ann",
        "DB_Password": "[REDACTED:password]",
        "api-key": "[REDACTED:api_key]",
        "clientSecret": "[REDACTED:client_secret]",
        "tokens": [1, 2],
        "auth": {
            "refresh_token": "[REDACTED:token]",
            "private_key": None,
            "has_password": True,
        },
        "usage": {"total_tokens": 812, "token_type": "Bearer"},
    }
    assert n == 4
    assert redact(clean) == (clean, 0), "redacting twice changes nothing"


def test_json_inside_a_json_string_is_redacted_and_both_stay_valid() -> None:
    inner = json.dumps({"password": 'a"b\\c', "user": "ann"})
    clean, n = redact(json.dumps({"body": inner}))
    assert n == 1
    assert json.loads(json.loads(clean)["body"]) == {
        "password": "[REDACTED:password]",
        "user": "ann",
    }


def test_the_issues_sixty_records_lose_every_secret_and_stay_valid_json() -> None:
    payload = json.dumps([_ten_secrets(i) for i in range(60)], indent=2)
    result = redact_payload(payload.encode())
    text = result.data.decode()
    rows = json.loads(text)
    assert len(rows) == 60 and all(len(row) == 11 for row in rows)
    for secret in [*SECRET_VALUES, "S3cr3tPass", "hunter2", "MII"]:
        assert secret not in text
    assert rows[0]["secret_access_key"] == "[REDACTED:aws_secret_access_key]"
    assert rows[0]["billing"] == "[REDACTED:stripe_access_token]"
    assert rows[0]["dsn"] == "postgres://admin:[REDACTED:url_password]@db.internal:5432/prod"
    assert result.count == 600 and set(result.counts) <= set(kinds())


def test_ndjson_stays_one_valid_record_per_line() -> None:
    lines = [json.dumps(_ten_secrets(i)) for i in range(5)]
    clean, _ = redact("\n".join(lines) + "\n")
    records = [json.loads(line) for line in clean.splitlines()]
    assert len(records) == 5
    assert {record["github"] for record in records} == {"[REDACTED:github_pat]"}


def test_csv_keeps_its_rows_and_columns() -> None:
    rows = [["id", "user", "Api Token", "note"]]
    rows += [[str(i), f"u{i}", f'tok,{i}"x', "a, b"] for i in range(20)]
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    clean, n = redact(out.getvalue())
    parsed = list(csv.reader(io.StringIO(clean)))
    assert n == 20
    assert [row[:2] + row[3:] for row in parsed] == [row[:2] + row[3:] for row in rows]
    assert {row[2] for row in parsed[1:]} == {"[REDACTED:token]"}


def test_a_log_line_with_a_comma_is_not_taken_for_csv() -> None:
    text = "Starting, token refresh enabled\nworker 1, ready\n"
    assert redact(text) == (text, 0)


def test_go_regexes_become_python_ones() -> None:
    assert go_regex(r"\b(SG\.(?i)[a-z]{3})(?:;|$)") == r"\b(SG\.(?i:[a-z]{3}))(?:;|$)"
    assert go_regex(r"(?i)abc\z") == r"(?i)abc\Z"


# The offload path


@pytest.mark.parametrize("records", [60, 6000])
def test_no_secret_reaches_the_notice_or_the_stored_payload(harness: Harness, records: int) -> None:
    """6000 records (about 9 MB) is far past what the profile reads (256 KB): the whole
    payload is still redacted before anything is stored or shown."""
    task = harness.task("t1", retention=Retention(redact=True))
    payload = json.dumps([_ten_secrets(i) for i in range(records)])
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload)])
    assert admitted.offloaded and admitted.artifact is not None
    stored = admitted.artifact.host_path.read_text()
    for secret in [*SECRET_VALUES, "S3cr3tPass", "hunter2", "BEGIN RSA"]:
        assert secret not in stored
        assert secret not in admitted.text
    assert json.loads(stored)[-1]["dsn"].startswith("postgres://admin:[REDACTED:")
    assert f"redactions: {records * 10}" in admitted.text.splitlines()
    assert "shape: JSON array of" in admitted.text


def test_a_large_binary_payload_redacted_when_stored_gets_the_digest_of_what_is_stored(
    harness: Harness,
) -> None:
    """The gate begins a large payload's sha256 before the store redacts it (a binary
    result is redacted there, not before the gate): the digest of the bytes given must not
    pass for that of the bytes stored."""
    task = harness.task("t1", retention=Retention(redact=True))
    payload = b"\xff\x00" + (f"key={aws_id}\n".encode() + os.urandom(64)) * 20_000
    assert len(payload) >= PARALLEL_HASH_BYTES
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload)])
    assert admitted.reason == "binary" and admitted.artifact is not None
    stored = admitted.artifact.host_path.read_bytes()
    assert aws_id.encode() not in stored and stored != payload
    assert admitted.artifact.sha256 == hashlib.sha256(stored).hexdigest()
    [row] = harness.catalog.artifacts("t1")
    assert row.sha256 == admitted.artifact.sha256


def test_the_access_log_records_counts_per_kind_and_never_a_secret(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(redact=True))
    payload = json.dumps([_ten_secrets(i) for i in range(60)])
    task.admit([ToolResult(call_id="c1", tool="t", content=payload)])
    task.admit([ToolResult(call_id="c2", tool="t", content=b"\x89PNG\r\n\x1a\n" + bytes(9000))])
    log = harness.catalog.audit("t1")
    redacted = [entry for entry in log if entry.action == "redact"]
    assert [entry.artifact_id for entry in redacted] == ["c1", "c2"]
    first = json.loads(redacted[0].detail)
    assert first["replaced"] == 600
    assert first["kinds"]["github_pat"] == 60 and first["kinds"]["password"] == 60
    assert json.loads(redacted[1].detail) == {"replaced": 0, "kinds": {}}  # scanned as bytes
    everything = json.dumps([entry.__dict__ for entry in log])
    for secret in [*SECRET_VALUES, "S3cr3tPass", "hunter2"]:
        assert secret not in everything


def test_a_result_small_enough_to_stay_inline_reaches_the_model_redacted(
    harness: Harness,
) -> None:
    """The gate keeps a small result in context: it is redacted before, not only what is
    stored, and the access log says so (with its call id, as it has no artifact)."""
    task = harness.task("t1", retention=Retention(redact=True))
    small = json.dumps(_ten_secrets(0))
    big = json.dumps([_ten_secrets(i) for i in range(60)])
    inline, offloaded = task.admit(
        [
            ToolResult(call_id="small", tool="t", content=small),
            ToolResult(call_id="big", tool="t", content=big),
        ]
    )
    assert not inline.offloaded and offloaded.offloaded
    assert json.loads(inline.text)["password"] == "[REDACTED:password]"
    for secret in [*SECRET_VALUES, "S3cr3tPass", "hunter2"]:
        assert secret not in inline.text and secret not in offloaded.text
    entries = [e for e in harness.catalog.audit("t1") if e.action == "redact"]
    by_call = {json.loads(e.detail).get("call_id", e.artifact_id): e for e in entries}
    assert set(by_call) == {"small", "big"}
    assert by_call["small"].artifact_id is None
    assert json.loads(by_call["small"].detail)["replaced"] == 10
    assert json.loads(by_call["big"].detail)["replaced"] == 600  # counted where it was done
    assert offloaded.artifact is not None
    assert b"S3cr3tPass" not in offloaded.artifact.host_path.read_bytes()


def test_without_redaction_nothing_is_logged_as_redacted(harness: Harness) -> None:
    task = harness.task("t1")
    task.admit([ToolResult(call_id="c1", tool="t", content=json.dumps([_ten_secrets(0)] * 60))])
    assert not [entry for entry in harness.catalog.audit("t1") if entry.action == "redact"]


def test_a_redaction_says_what_it_did() -> None:
    assert Redaction(b"x", {"jwt": 1, "github_pat": 2}).count == 3


def test_read_artifact_pages_the_redacted_records(harness: Harness) -> None:
    task = harness.task("t1", retention=Retention(redact=True))
    payload = json.dumps([_ten_secrets(i) for i in range(200)])
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=payload)])
    assert admitted.artifact is not None
    page = json.loads(Toolset(task).call("read_artifact", {"path": admitted.artifact.path}).text)
    assert page["total"] == 200 and page["items"][0]["id"] == 0
    assert page["items"][0]["password"] == "[REDACTED:password]"
    for secret in [*SECRET_VALUES, "hunter2"]:
        assert secret not in json.dumps(page)


@pytest.mark.docker
def test_sql_runs_on_redacted_json_and_csv(docker_home: Path) -> None:
    table = "id,user,api_token\n" + "".join(f"{i},u{i},{github_pat}{i}\n" for i in range(500))
    with (
        Harness(sandbox="docker", home=docker_home) as harness,
        harness.task("t1", retention=Retention(redact=True)) as task,
    ):
        task.admit(
            [
                ToolResult(
                    call_id="j", tool="t", content=json.dumps([_ten_secrets(i) for i in range(200)])
                ),
                ToolResult(call_id="c", tool="t", content=table),
            ]
        )
        rows = task.exec("sql", 'SELECT count(*) AS n, min(password) AS p, max(id) AS m FROM "j"')
        assert rows.exit_code == 0, rows.stderr
        assert rows.text.splitlines()[1] == "200,[REDACTED:password],199"
        tokens = task.exec("sql", 'SELECT count(DISTINCT api_token) AS n, max(id) AS m FROM "c"')
        assert tokens.exit_code == 0, tokens.stderr
        assert tokens.text.splitlines()[1] == "1,499"
