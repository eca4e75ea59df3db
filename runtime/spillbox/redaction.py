"""Redaction: secrets replaced by `[REDACTED:<kind>]` before a payload is stored.

    result = redact_payload(b'{"user": "ann", "db_password": "hunter2!"}')
    result.data      # b'{"user": "ann", "db_password": "[REDACTED:password]"}'
    result.counts    # {"password": 1}

Two sources of rules, run in one pass:

- **provider rules**: gitleaks' own rules, shipped as data (redaction_rules/gitleaks.toml,
  MIT, with its licence file): AWS, GCP, Azure, Stripe, GitHub, GitLab, Bitbucket, Slack,
  Discord, Telegram, OpenAI, Anthropic, Hugging Face, npm, PyPI, private keys, JWTs, ...
  Each rule's secret (its first group) is replaced, kind = the rule's id.
- **field rules** (below): credentials inside URLs, Authorization headers, and values of
  secret-named fields (`*secret*`, `*password*`, `*token*`, `*api_key*`, `*private_key*`,
  ... in any case or separator) in JSON, NDJSON, YAML, .env, logs and CSV. In JSON a
  secret-named key's whole value is replaced whatever its format (a number or an object
  becomes the string "[REDACTED:<kind>]"), so the document stays valid; in CSV every
  value of a secret-named column is replaced.

Speed: one Hyperscan pass over the bytes finds every place a rule could match (gitleaks'
keywords, as gitleaks does with Aho-Corasick); the rules' regexes then run only around
those places. A 40 MB payload takes a few tens of milliseconds more than the scan itself
when it holds few candidates (benchmarks/gate_bench.py reports it against the store floor).
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import math
import re
import threading
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import hyperscan

RULES_FILES = (
    Path(__file__).parent / "redaction_rules" / "gitleaks.toml",
    Path(__file__).parent / "redaction_rules" / "spillbox.toml",
)
"""gitleaks' rules (a subset, verbatim, MIT), then spillbox's own in the same format."""
MARK = b"[REDACTED:"
WINDOW = 1024
"""How far (bytes) around a candidate place a provider rule's regex looks."""
PRIVATE_KEY_WINDOW = 64 * 1024
KEY_CHARS = 100
"""Longest field name a field rule looks back over from its keyword."""

# Field names that hold secrets: any case, any separator, anywhere in the name.
_SECRET_WORDS = (
    rb"secret|passw(?:or)?d|passphrase|pwd|token|api[_.\- ]?key|apikey|private[_.\- ]?key"
    rb"|access[_.\- ]?key|account[_.\- ]?key|credential|auth[_.\- ]?key|client[_.\- ]?secret"
    rb"|session[_.\- ]?id"
)
_SECRET_NAME = re.compile(rb"(?i)" + _SECRET_WORDS)
# Names that contain a secret word but name a count, a kind or a place, not a secret:
# the model needs `usage.total_tokens`, and a token's type or URL is no credential.
_NOT_SECRET_NAME = re.compile(
    rb"(?i)(?:tokens|tokeni[sz]er|[_.\- ]?(?:type|count|counts|limit|length|size|name|url"
    rb"|uri|endpoint|expires?_?(?:in|at)?|expiry|expiration|ttl|file|path|format))$"
)
_KIND_BY_NAME: tuple[tuple[re.Pattern[bytes], str], ...] = (
    (re.compile(rb"(?i)secret[_.\- ]?access[_.\- ]?key"), "aws_secret_access_key"),
    (re.compile(rb"(?i)private[_.\- ]?key"), "private_key"),
    (re.compile(rb"(?i)passw(?:or)?d|passphrase|pwd"), "password"),
    (re.compile(rb"(?i)api[_.\- ]?key|apikey"), "api_key"),
    (re.compile(rb"(?i)client[_.\- ]?secret"), "client_secret"),
    (re.compile(rb"(?i)token"), "token"),
    (re.compile(rb"(?i)(?:access|account|auth)[_.\- ]?key"), "access_key"),
    (re.compile(rb"(?i)credential"), "credential"),
    (re.compile(rb"(?i)session"), "session_id"),
)

# "name": value, with the name ending at the keyword's place (also inside an escaped
# JSON string, \"name\": \"value\", as tool results often nest JSON in JSON).
_JSON_KEY = re.compile(rb'(\\?)"([^"\\\n]{0,%d})\1"\s*:\s*' % KEY_CHARS)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
# A string inside an escaped JSON string: its quote is \", its own escapes \\x.
_JSON_ESCAPED_STRING = re.compile(rb'\\"(?:\\\\(?:\\.|[^\\])|\\[^"\\]|[^"\\])*\\"', re.DOTALL)
_JSON_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
# name=value / name: value outside JSON: .env and YAML lines, logs, query strings,
# connection strings (Password=...;), command lines (--password value is not covered).
_ASSIGNMENT = re.compile(
    rb"(?i)(?<![A-Za-z0-9_.\-])([A-Za-z0-9_.\-]{1,%d})['\"]?[ \t]*(?:=|:)[ \t]*" % KEY_CHARS
)
_ASSIGNED_VALUE = re.compile(rb""""([^"\r\n]*)"|'([^'\r\n]*)'|([^\s"'&;,<>`{}\[\]]+)""")
# gitleaks ends most secrets at a quote, a space, a semicolon or a line's end; in logs and
# prose a secret is as often followed by "." or ")" or "&": any non-token byte ends it.
_GITLEAKS_END = r"""(?:[\x60'"\s;]|\\[nr]|$)"""
_TOKEN_END = r"(?![A-Za-z0-9_\-])"
_URL_CREDENTIALS = re.compile(
    rb"(?i)\b[a-z][a-z0-9+.\-]{1,20}://[^\s:/@\"'<>]{0,256}:([^\s/@\"'<>]{1,256})@"
)
_AUTHORIZATION = re.compile(
    rb"(?i)\b(?:proxy-)?authori[sz]ation\\?['\"]?\s*[:=]\s*\\?['\"]?"
    rb"(bearer|basic|token|digest|negotiate|ntlm|apikey)?\s*([^\s\"'\\,;]{6,})"
)
_BEARER = re.compile(rb"(?i)\bbearer\s+([A-Za-z0-9._~+/=\-]{16,})")
_BASIC = re.compile(rb"\bBasic\s+([A-Za-z0-9+/]{8,}={0,2})")

_NOT_VALUES = (b"null", b"true", b"false", b"None", b"|", b">", b"|-", b">-", b"|+", b">+")
"""Left as they are: no secret (null, booleans), or a YAML block whose value is on the
following lines (not covered)."""

FIELD_KEYWORDS = (
    "secret", "passw", "passphrase", "pwd", "token", "api_key", "api-key", "apikey",
    "api key", "api.key", "private_key", "private-key", "privatekey", "private key",
    "access_key", "access-key", "accesskey", "account_key", "accountkey", "credential",
    "auth_key", "authkey",
    "session_id", "sessionid",
)  # fmt: skip
"""The Hyperscan keywords of the field rules: each is part of some secret-named field."""


@dataclass(frozen=True)
class Rule:
    """One provider rule: its regex runs around each place one of its triggers matched."""

    kind: str
    pattern: re.Pattern[bytes]
    triggers: tuple[str, ...]
    """Hyperscan expressions, matched case-insensitively (escaped keywords by default)."""
    entropy: float = 0.0
    """The secret's least Shannon entropy (bits per byte), as gitleaks checks it."""
    window: int = WINDOW


@dataclass(frozen=True)
class Redaction:
    """What redaction made of one payload."""

    data: bytes
    counts: Mapping[str, int] = field(default_factory=dict)
    """Replacements per kind."""
    scanned: bool = True
    """False for a binary payload (not UTF-8 text): stored as it came, and logged so."""

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def audit_detail(self, call_id: str | None = None) -> str:
        """The access log's record of it: replacements per kind, never a secret (and the
        call it was in, for a result that stayed in context and so has no artifact).

        >>> Redaction(b"", {"github_pat": 2}).audit_detail()
        '{"replaced": 2, "kinds": {"github_pat": 2}}'
        """
        record: dict[str, object] = {
            "replaced": self.count,
            "kinds": dict(sorted(self.counts.items())),
        }
        if call_id is not None:
            record["call_id"] = call_id
        if not self.scanned:
            record["scanned"] = "no: binary payload"
        return json.dumps(record)


@dataclass(order=True)
class _Span:
    start: int
    end: int
    kind: str = field(compare=False)
    rank: int = field(default=0, compare=False)
    """Of spans at one place the lowest rank wins: provider rules (0), JSON fields (1),
    other fields (2), URLs and headers (3)."""
    quote: bool = field(default=False, compare=False)
    """Replace with a JSON string (quotes included): the span was a non-string value."""


def redact_payload(data: bytes) -> Redaction:
    """The payload with every secret found replaced, and how many of each kind."""
    data, counts = _apply(data, list(_spans(data)))
    csv_data, csv_counts = _redact_csv_columns(data)
    if csv_counts:
        data = csv_data
        counts.update(csv_counts)
    return Redaction(data, dict(counts))


def redact(text: str) -> tuple[str, int]:
    """The text with every secret replaced, and how many were.

    >>> redact("key AKIAABCDEFGHIJKLMNOP here")
    ('key [REDACTED:aws_access_token] here', 1)
    """
    result = redact_payload(text.encode("utf-8"))
    return result.data.decode("utf-8"), result.count


def kinds() -> list[str]:
    """Every kind a replacement can name: the provider rules' and the field rules'."""
    names = [rule.kind for rule in _engine().rules]
    names += [kind for _, kind in _KIND_BY_NAME]
    names += ["secret", "url_password", "authorization", "bearer_token", "basic_auth"]
    return sorted(set(names))


# Finding


class _Engine:
    """The compiled rules and one Hyperscan database of every trigger."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        expressions: list[bytes] = []
        self.owners: list[int | None] = []  # the rule's index; None: a field keyword
        for index, rule in enumerate(rules):
            for trigger in rule.triggers:
                expressions.append(trigger.encode())
                self.owners.append(index)
        for keyword in FIELD_KEYWORDS:
            expressions.append(re.escape(keyword).encode())
            self.owners.append(None)
        self.database = _database(expressions, [hyperscan.HS_FLAG_CASELESS] * len(expressions))
        # A Hyperscan database has one scratch space: one scan at a time.
        self.lock = threading.Lock()

    def places(self, data: bytes) -> tuple[dict[int, list[int]], list[int]]:
        """Where each rule (by index) could match, and where a field keyword ends."""
        by_rule: dict[int, list[int]] = {}
        keywords: list[int] = []
        for id_, end in _scan(self.database, self.lock, data):
            owner = self.owners[id_]
            if owner is None:
                keywords.append(end)
            else:
                by_rule.setdefault(owner, []).append(end)
        return by_rule, keywords


def _database(expressions: list[bytes], flags: list[int]) -> hyperscan.Database:
    database = hyperscan.Database()
    database.compile(
        expressions=expressions,
        ids=list(range(len(expressions))),
        elements=len(expressions),
        flags=flags,
    )
    return database


def _scan(database: hyperscan.Database, lock: threading.Lock, data: bytes) -> list[tuple[int, int]]:
    """(expression id, end offset) of every match of the database in data."""
    found: list[tuple[int, int]] = []

    def on_match(id_: int, start: int, end: int, flags: int, context: object) -> None:
        found.append((id_, end))

    with lock:
        database.scan(data, match_event_handler=on_match)
    return found


@cache
def _engine() -> _Engine:
    return _Engine([rule for path in RULES_FILES for rule in load_rules(path)])


def load_rules(path: Path) -> list[Rule]:
    """The provider rules of a gitleaks-format TOML file, in Python's regex dialect."""
    rules = []
    for entry in tomllib.loads(path.read_text(encoding="utf-8"))["rules"]:
        triggers = (
            (entry["trigger"],)
            if "trigger" in entry
            else tuple(re.escape(keyword) for keyword in entry["keywords"])
        )
        kind = entry["id"].replace("-", "_")
        rules.append(
            Rule(
                kind=kind,
                pattern=re.compile(
                    go_regex(entry["regex"]).replace(_GITLEAKS_END, _TOKEN_END).encode()
                ),
                triggers=triggers,
                entropy=float(entry.get("entropy", 0.0)),
                window=PRIVATE_KEY_WINDOW if kind == "private_key" else WINDOW,
            )
        )
    return rules


def go_regex(pattern: str) -> str:
    """A Go (RE2) regex as Python's: RE2 lets `(?i)` stand mid-pattern, flagging the rest
    of its group; Python wants `(?i:...)` there. `\\z` is Python's `\\Z`.

    >>> go_regex(r"\\b(SG\\.(?i)[a-z]{66})(?:;|$)")
    '\\\\b(SG\\\\.(?i:[a-z]{66}))(?:;|$)'
    """
    pattern = pattern.replace(r"\z", r"\Z")
    at = pattern.find("(?i)", 1)
    while at > 0:
        depth, end, i = 0, len(pattern), at + 4
        while i < len(pattern):
            char = pattern[i]
            if char == "\\":
                i += 2
                continue
            if char == "[":
                i = pattern.index("]", i + 2)
            elif char == "(":
                depth += 1
            elif char == ")":
                if depth == 0:
                    end = i
                    break
                depth -= 1
            i += 1
        pattern = pattern[:at] + "(?i:" + pattern[at + 4 : end] + ")" + pattern[end:]
        at = pattern.find("(?i)", 1)
    return pattern


def _spans(data: bytes) -> Iterator[_Span]:
    engine = _engine()
    by_rule, keywords = engine.places(data)
    for index, ends in by_rule.items():
        rule = engine.rules[index]
        for start, end in _windows(ends, rule.window, len(data)):
            for match in rule.pattern.finditer(data, start, end):
                span = _secret_span(match)
                if span is None:
                    continue
                if rule.entropy and _entropy(data[span[0] : span[1]]) < rule.entropy:
                    continue
                yield _Span(span[0], _word_end(data, span[1]), rule.kind)
    for start, end in _windows(keywords, KEY_CHARS + 16, len(data)):
        yield from _field_spans(data, start, end)
    yield from _url_and_header_spans(data)


def _windows(ends: list[int], reach: int, size: int) -> Iterator[tuple[int, int]]:
    """Merged byte ranges of `reach` either side of each place."""
    start = end = -1
    for place in sorted(ends):
        lo, hi = max(0, place - reach), min(size, place + reach)
        if lo > end:
            if end >= 0:
                yield start, end
            start = lo
        end = max(end, hi)
    if end >= 0:
        yield start, end


def _secret_span(match: re.Match[bytes]) -> tuple[int, int] | None:
    """The secret in a rule's match: its first group that matched, else all of it."""
    for group in range(1, match.re.groups + 1):
        if match.end(group) > match.start(group) >= 0:
            return match.start(group), match.end(group)
    return (match.start(), match.end()) if match.end() > match.start() else None


def _word_end(data: bytes, end: int) -> int:
    """A secret's end moved past the token characters that follow it: a rule of fixed
    length must not leave the tail of a longer token behind."""
    if not end or not _TOKEN_TAIL.match(data, end - 1):
        return end
    match = _TOKEN_TAIL.match(data, end)
    return match.end() if match else end


_TOKEN_TAIL = re.compile(rb"[A-Za-z0-9_\-]+")


def _entropy(secret: bytes) -> float:
    """Shannon entropy in bits per byte, of the first 64 bytes: gitleaks' thresholds
    (2 to 4.5) are far below what 64 bytes can show (6), and a long token costs no more."""
    secret = secret[:64]
    size = len(secret)
    return math.log2(size) - sum(n * math.log2(n) for n in Counter(secret).values()) / size


def _field_kind(name: bytes) -> str | None:
    """The kind of a secret-named field, or None when the name is no secret's."""
    if not _SECRET_NAME.search(name) or _NOT_SECRET_NAME.search(name):
        return None
    return next((kind for pattern, kind in _KIND_BY_NAME if pattern.search(name)), "secret")


def _field_spans(data: bytes, start: int, end: int) -> Iterator[_Span]:
    """Values of secret-named fields whose name lies in data[start:end]."""
    for match in _JSON_KEY.finditer(data, start, end):
        kind = _field_kind(match[2])
        if kind is None:
            continue
        value = _json_value(data, match.end(), escaped=bool(match[1]))
        if value is not None:
            yield _Span(value[0], value[1], kind, rank=1, quote=value[2])
    for match in _ASSIGNMENT.finditer(data, start, end):
        kind = _field_kind(match[1])
        assigned = _ASSIGNED_VALUE.match(data, match.end()) if kind else None
        group = next((g for g in (1, 2, 3) if assigned and assigned[g]), None)
        if kind is None or assigned is None or group is None:
            continue
        if assigned[group].startswith(MARK) or assigned[group] in _NOT_VALUES:
            continue
        yield _Span(assigned.start(group), assigned.end(group), kind, rank=2)


def _json_value(data: bytes, at: int, escaped: bool) -> tuple[int, int, bool] | None:
    """The span of the JSON value at `at`: (start, end, whether it needs quotes).
    Strings lose only their content; numbers, objects and arrays become a string;
    true, false and null stay (they hold no secret)."""
    if escaped:
        match = _JSON_ESCAPED_STRING.match(data, at)
        return (match.start() + 2, match.end() - 2, False) if match else None
    head = data[at : at + 1]
    if head == b'"':
        match = _JSON_STRING.match(data, at)
        if not match or data.startswith(MARK, at + 1):
            return None
        return match.start() + 1, match.end() - 1, False
    if head in (b"{", b"["):
        depth = 0
        for token in _JSON_TOKEN.finditer(data, at):
            if token[0] in (b"{", b"["):
                depth += 1
            elif token[0] in (b"}", b"]"):
                depth -= 1
                if depth == 0:
                    return at, token.end(), True
        return None
    match = _JSON_NUMBER.match(data, at)
    return (at, match.end(), True) if match else None


def _url_and_header_spans(data: bytes) -> Iterator[_Span]:
    """Passwords in URLs, and Authorization headers' credentials, found by their own
    Hyperscan pass (their anchors, "://" and "bearer", are too common to look around)."""
    urls: list[int] = []
    headers: list[int] = []
    for id_, end in _scan(_header_database(), _header_lock, data):
        (urls if id_ == 0 else headers).append(end)
    for start, end in _windows(urls, 600, len(data)):
        for match in _URL_CREDENTIALS.finditer(data, start, end):
            if not match[1].startswith(MARK):
                yield _Span(match.start(1), match.end(1), "url_password", rank=3)
    for start, end in _windows(headers, 300, len(data)):
        for match in _AUTHORIZATION.finditer(data, start, end):
            if match[2].startswith(MARK):
                continue
            scheme = (match[1] or b"").lower()
            kind = {b"bearer": "bearer_token", b"basic": "basic_auth"}.get(scheme, "authorization")
            yield _Span(match.start(2), match.end(2), kind, rank=3)
        for pattern, kind, check in _BARE_SCHEMES:
            for match in pattern.finditer(data, start, end):
                if not match[1].startswith(MARK) and check(match[1]):
                    yield _Span(match.start(1), match.end(1), kind, rank=3)


def _basic_credentials(token: bytes) -> bool:
    """A Basic scheme's token is base64 of user:password."""
    try:
        return b":" in base64.b64decode(token + b"=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False


_BARE_SCHEMES: tuple[tuple[re.Pattern[bytes], str, Callable[[bytes], bool]], ...] = (
    (_BEARER, "bearer_token", lambda token: _entropy(token) >= 3.0),
    (_BASIC, "basic_auth", _basic_credentials),
)


@cache
def _header_database() -> hyperscan.Database:
    expressions = [
        rb"://[^\s/@\"'<>]*:[^\s/@\"'<>]*@",
        rb"authori[sz]ation",
        rb"bearer\s",
        rb"Basic\s",
    ]
    caseless = hyperscan.HS_FLAG_CASELESS
    return _database(expressions, [caseless, caseless, caseless, 0])


_header_lock = threading.Lock()


# Replacing


def _apply(data: bytes, spans: list[_Span]) -> tuple[bytes, Counter[str]]:
    """data with each span replaced; of overlapping spans the first (then longest) wins."""
    counts: Counter[str] = Counter()
    if not spans:
        return data, counts
    spans.sort(key=lambda s: (s.start, -s.end, s.rank))
    out: list[bytes] = []
    at = 0
    for span in spans:
        start, end = span.start, span.end
        if start < at:
            continue
        # Never cut a JSON escape in two: a trailing backslash would escape the quote after.
        while end > start and _odd_backslashes(data, start, end):
            end -= 1
        if end <= start:
            continue
        mark = MARK + span.kind.encode() + b"]"
        out += [data[at:start], b'"' + mark + b'"' if span.quote else mark]
        at = end
        counts[span.kind] += 1
    out.append(data[at:])
    return b"".join(out), counts


def _odd_backslashes(data: bytes, start: int, end: int) -> bool:
    run = 0
    while end - run > start and data[end - run - 1] == 0x5C:
        run += 1
    return run % 2 == 1


def _redact_csv_columns(data: bytes) -> tuple[bytes, Counter[str]]:
    """CSV whose header names a secret column: every value of that column replaced.

    Only a payload whose first line reads as a header (two or more comma-separated
    names, each a short identifier-like name) and whose second line has as many fields
    is parsed as CSV, so that a log line with a comma is not taken for one."""
    counts: Counter[str] = Counter()
    lines = data.split(b"\n", 2)
    if len(lines) < 2 or not _CSV_HEADER.match(lines[0]):
        return data, counts
    try:
        text = data.decode("utf-8")
        header, second = (next(csv.reader([line.decode().rstrip("\r")])) for line in lines[:2])
    except (UnicodeDecodeError, csv.Error, StopIteration):
        return data, counts
    columns = {i: _field_kind(name.encode()) for i, name in enumerate(header)}
    secret = {i: kind for i, kind in columns.items() if kind}
    if not secret or len(second) != len(header):
        return data, counts
    line_end = "\r\n" if lines[0].endswith(b"\r") else "\n"
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=line_end)
    for number, row in enumerate(csv.reader(io.StringIO(text))):
        for i, kind in secret.items():
            if number and i < len(row) and row[i] and not row[i].startswith("[REDACTED:"):
                row[i] = f"[REDACTED:{kind}]"
                counts[kind] += 1
        writer.writerow(row)
    result = out.getvalue()
    if not text.endswith("\n"):
        result = result[: -len(line_end)]
    return result.encode("utf-8"), counts


_CSV_HEADER = re.compile(rb'^"?[A-Za-z_][\w .\-]{0,63}"?(?:,"?[A-Za-z_][\w .\-]{0,63}"?)+\r?$')
